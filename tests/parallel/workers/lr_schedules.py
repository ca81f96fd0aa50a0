"""Fits least squares (one Dense(1) layer, distributed SGD with momentum)
under a learning-rate callback, each rank on its half of every global batch,
and writes the rate each batch started with and the weights before and after
to OUT/<run>.rank<r>.npz, for two runs:

  warmup: LearningRateWarmupCallback (2 epochs) then an epoch at full rate;
  fractional_warmup: the same over 1.5 epochs, ending inside epoch 2;
  decay:  LearningRateScheduleCallback with a constant multiplier (exponential
          decay per epoch from epoch 1), Nesterov momentum.

The data: GLOBAL_BATCH x STEPS rows, seeded; see tests/parallel/test_lr_callbacks.py.
"""

import sys

import keras
import numpy as np

import hvdtrain
import hvdtrain.keras

STEPS, GLOBAL_BATCH, EPOCHS, LR = 3, 8, 3, 0.05


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype("float32")
    return x, y


def run(name, callback, nesterov=False):
    x, y = data()
    # Rank r's rows of each global batch: its r-th half.
    half = GLOBAL_BATCH // hvdtrain.size()
    mine = np.concatenate([np.arange(s * GLOBAL_BATCH + hvdtrain.rank() * half,
                                     s * GLOBAL_BATCH + (hvdtrain.rank() + 1) * half)
                           for s in range(STEPS)])
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    initial = model.get_weights()
    model.compile(optimizer=hvdtrain.DistributedOptimizer(
        keras.optimizers.SGD(LR, momentum=0.9, nesterov=nesterov)), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))

    model.fit(x[mine], y[mine], batch_size=half, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvdtrain.keras.callbacks.BroadcastGlobalVariablesCallback(0), callback,
                         Record()])
    np.savez(f"{OUT}/{name}.rank{hvdtrain.rank()}.npz", lrs=np.array(seen),
             w0=initial[0], b0=initial[1], w=model.get_weights()[0], b=model.get_weights()[1])


OUT = sys.argv[1]
hvdtrain.init()
run("warmup", hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=2))
run("fractional_warmup", hvdtrain.keras.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=1.5))
run("decay", hvdtrain.keras.callbacks.LearningRateScheduleCallback(LR, 0.5, start_epoch=1),
    nesterov=True)
