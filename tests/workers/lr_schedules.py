"""Fits least squares (one Dense(1) layer, distributed SGD with momentum)
under a learning-rate callback, each rank on its half of every global batch;
`run(name)` gives the rate each batch started with and the weights before
and after, for these runs:

  warmup: LearningRateWarmupCallback (2 epochs) then an epoch at full rate;
  fractional_warmup: the same over 1.5 epochs, ending inside epoch 2;
  decay:  LearningRateScheduleCallback with a constant multiplier (exponential
          decay per epoch from epoch 1), Nesterov momentum;
  warmup_nesterov_decay, warmup_rmsprop_decay: the warm-up of `warmup` with
          Nesterov SGD, and RMSprop with momentum, each with decoupled
          weight decay (WEIGHT_DECAY).

The data: GLOBAL_BATCH x STEPS rows, seeded; see tests/ranked/test_lr_callbacks.py.
"""

import keras
import numpy as np

import hvdtrain
import hvdtrain.keras
from workers.shares import rank_rows

STEPS, GLOBAL_BATCH, EPOCHS, LR, WEIGHT_DECAY = 3, 8, 3, 0.05, 0.5

RUNS = {
    "warmup": lambda: (hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=2),
                       None),
    "fractional_warmup": lambda: (
        hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=1.5), None),
    "decay": lambda: (hvdtrain.keras.callbacks.LearningRateScheduleCallback(LR, 0.5, start_epoch=1),
                      keras.optimizers.SGD(LR, momentum=0.9, nesterov=True)),
    "warmup_nesterov_decay": lambda: (
        hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, 2),
        keras.optimizers.SGD(LR, momentum=0.9, nesterov=True, weight_decay=WEIGHT_DECAY)),
    "warmup_rmsprop_decay": lambda: (
        hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, 2),
        keras.optimizers.RMSprop(LR, momentum=0.9, weight_decay=WEIGHT_DECAY)),
}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype("float32")
    return x, y


def run(name):
    """{"lrs": the rate of each batch, "w0", "b0": the initial weights, "w", "b":
    the trained ones} of run `name` (of RUNS)."""
    callback, optimizer = RUNS[name]()
    x, y = data()
    half = GLOBAL_BATCH // hvdtrain.size()
    mine = rank_rows(STEPS, GLOBAL_BATCH)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    initial = model.get_weights()
    model.compile(optimizer=hvdtrain.DistributedOptimizer(
        optimizer or keras.optimizers.SGD(LR, momentum=0.9)), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))

    model.fit(x[mine], y[mine], batch_size=half, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvdtrain.keras.callbacks.BroadcastGlobalVariablesCallback(0), callback,
                         Record()])
    return {"lrs": np.array(seen), "w0": initial[0], "b0": initial[1],
            "w": model.get_weights()[0], "b": model.get_weights()[1]}
