"""One SGD step of a small model on GLOBAL_BATCH fixed examples split over
the workers (per-worker batch GLOBAL_BATCH / size): `step` in a test's own
process (tests/ranked/test_training.py), or `python one_step.py OUT
GLOBAL_BATCH` alone, for the single-process reference, writing the initial
and updated weights to OUT."""

import sys

import keras
import numpy as np

import hvdtrain


def step(global_batch):
    """The weights (initial, after the step)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch, 6)).astype("float32")
    y = rng.normal(size=(global_batch, 2)).astype("float32")

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.5)), loss="mse")
    initial = model.get_weights()
    data = hvdtrain.data.from_arrays((x, y), global_batch // hvdtrain.size(), training=True)
    assert data.steps == 1 and data.dropped == 0
    model.fit(data.for_epochs(1), epochs=1, steps_per_epoch=data.steps, verbose=0,
              callbacks=[hvdtrain.callbacks.BroadcastInitialState(0)])
    return initial, model.get_weights()


if __name__ == "__main__":
    hvdtrain.init()
    initial, after = step(int(sys.argv[2]))
    np.savez(sys.argv[1], *initial, *after)
