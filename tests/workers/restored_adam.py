"""Through the Horovod-style facade: rank 0 trains a small model with a plain
Adam on its own, saves it and reloads it with hvd.load_model (Adam state
restored, optimizer made distributed); rank 1 builds the same architecture
from other random weights with a fresh DistributedOptimizer(Adam). Both then
fit two steps with BroadcastGlobalVariablesCallback(0). `run` gives this
rank's model and optimizer values when loaded or built, right after the
broadcast and after the two steps, and facts about its optimizer
(tests/ranked/test_keras_facade.py)."""

import keras
import numpy as np

import hvdtrain.keras as hvd
from hvdtrain.parallel.data_parallel.optimizer import is_distributed


def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                             keras.layers.Dense(1)])


def state(model):
    variables = [*model.variables, *model.optimizer.variables]
    return [np.asarray(v) for v in variables], [v.path for v in variables]


def run(out):
    """(values before, after the broadcast, after the steps: one list, in
    that order; {"paths", "distributed", "optimizer"}); rank 0 saves its
    trained model under OUT (its own directory)."""
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    if hvd.rank() == 0:
        trained = make_model()
        trained.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        trained.fit(x, y, batch_size=8, epochs=3, verbose=0)
        trained.save(f"{out}/trained.keras")
        model = hvd.load_model(f"{out}/trained.keras")
    else:
        model = make_model()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
        model.optimizer.build(model.trainable_variables)
    before, paths = state(model)
    after_broadcast = []

    class Record(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            after_broadcast.extend(state(self.model)[0])

    shard = slice(hvd.rank() * 8, (hvd.rank() + 1) * 8)
    model.fit(x[shard], y[shard], batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Record()])
    after, _ = state(model)
    return [*before, *after_broadcast, *after], {
        "paths": paths, "distributed": is_distributed(model.optimizer),
        "optimizer": type(model.optimizer).__name__}
