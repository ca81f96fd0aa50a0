"""Trains a small MLP for STEPS steps of GLOBAL_BATCH fixed examples with
each optimizer setting of CASES, built as `hvdtrain train` builds it
(compiled_model, from the settings' flags), each rank on its share of every
global batch. `train(settings)`: the weights after training, and with
--ema_momentum the moving averages, in a test's own process
(tests/ranked/test_training_knobs.py); `python optimizers.py OUT`: rank 0
writes them to OUT/<case>.npz, for each case. Run at np=1 and np=2, the
results should match: the global batch is the same."""

import sys
import types

import keras
import numpy as np

import hvdtrain
from hvdtrain.config import TrainConfig
from hvdtrain.run import compiled_model

try:
    from shares import rank_rows  # run as a script: tests/workers on the path
except ImportError:
    from workers.shares import rank_rows  # imported by a ranked test: tests/ on the path

STEPS, GLOBAL_BATCH, LR = 3, 16, 0.05
# Clipping thresholds well below these gradients' size, so that they bind.
CASES = {
    "sgd": dict(optimizer="sgd"),
    "sgd_nesterov_decay": dict(optimizer="sgd", nesterov=True, weight_decay=0.1),
    "sgd_clipnorm": dict(optimizer="sgd", clipnorm=0.05),
    "sgd_clipvalue": dict(optimizer="sgd", clipvalue=0.01),
    "adam": dict(optimizer="adam"),
    "adam_global_clipnorm": dict(optimizer="adam", global_clipnorm=0.05),
    "adam_ema": dict(optimizer="adam", ema_momentum=0.5),
    "adamw": dict(optimizer="adamw", weight_decay=0.1),
    "rmsprop": dict(optimizer="rmsprop", momentum=0.5),
    **{name: dict(optimizer=name) for name in (
        "lamb", "lion", "adafactor", "adagrad", "adadelta", "adamax", "ftrl", "muon", "nadam",
        "schedulefreeadamw")},
}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 6)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(6, 2))).astype("float32")
    return x, y


def train(settings):
    """The weights after training with `settings`, then any moving averages."""
    x, y = data()
    share = GLOBAL_BATCH // hvdtrain.size()
    mine = rank_rows(STEPS, GLOBAL_BATCH)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2)])
    # One worker's rate, which compile_model scales by the workers: LR at any np.
    config = TrainConfig(learning_rate=LR / hvdtrain.size(), **settings).validate()
    recipe = types.SimpleNamespace(loss="mse", metrics=())
    compiled_model.compile_model(model, recipe, config)
    model.fit(x[mine], y[mine], batch_size=share, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdtrain.callbacks.BroadcastInitialState(0)])
    optimizer = model.optimizer
    averages = getattr(optimizer, "_model_variables_moving_average", [])
    return [*model.get_weights(), *[a.numpy() for a in averages]]


if __name__ == "__main__":
    hvdtrain.init(intra_op_threads=1)
    for case, settings in CASES.items():
        trained = train(settings)
        if hvdtrain.is_main_process():
            np.savez(f"{sys.argv[1]}/{case}.npz", *trained)
