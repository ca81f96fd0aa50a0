"""mixed_float16 training at np=2 where rank 1's second batch overflows
float16 (an input of 1e6). `run` gives this rank's weights and loss scale
after every step, with its model's output and variable dtypes
(tests/ranked/test_precision.py)."""

import keras
import numpy as np
import tensorflow as tf

import hvdtrain


def run():
    """{"weights": per step, "scale": per step, "optimizer", "output_dtype",
    "variable_dtypes"}."""
    hvdtrain.init(precision="mixed_float16")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(hvdtrain.rank())
    x = rng.normal(size=(4 * 8, 6)).astype("float32")
    y = rng.normal(size=(4 * 8, 2)).astype("float32")
    if hvdtrain.rank() == 1:
        x[8:16] = 1e6  # batch 1: inf in float16 activations, NaN gradients on this rank only

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2, dtype="float32")])
    optimizer = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    steps = {"weights": [], "scale": []}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps["weights"].append(np.concatenate([np.ravel(w) for w in model.get_weights()]))
            steps["scale"].append(float(model.optimizer.dynamic_scale))

    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0,
              callbacks=[hvdtrain.callbacks.BroadcastInitialState(0), Record()])
    return {"weights": np.stack(steps["weights"]), "scale": np.array(steps["scale"]),
            "optimizer": type(model.optimizer).__name__,
            "output_dtype": model(x[:1]).dtype.name,
            "variable_dtypes": sorted({v.dtype for v in model.variables})}
