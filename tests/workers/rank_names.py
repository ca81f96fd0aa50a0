"""Trains small models at np>=2 in ways that give the ranks' layers and
variables different auto-generated names (tests/ranked/test_reduction.py
runs them); prints "trained <case> <loss>" per case on each rank. Any
collective named after something rank-specific would block every rank.

The cases: "extra_layer": rank 1 makes a throwaway layer first, then
every rank fits with DistributedOptimizer and runs a DistributedGradientTape
step; "load_twice": Horovod's load_model test twice in one process: every rank
fits a model, rank 0 saves it and loads it back with hvd.load_model while
the others build a new one; all fit that;
"two_optimizers": one tf.function step updates two models with two
accumulating DistributedOptimizers (their reductions in two cond branches
of one graph).
"""

import keras
import numpy as np
import tensorflow as tf

import hvdtrain
import hvdtrain.keras as hvd


def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                             keras.layers.Dense(1)])


def data():
    rng = np.random.default_rng(hvd.rank())
    return rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


def fit(model, case):
    x, y = data()
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()])
    print(f"trained {case} {history.history['loss'][-1]:.6f}", flush=True)


def extra_layer():
    if hvd.rank() == 1:
        keras.layers.Dense(2)  # shifts this rank's auto-generated names
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    fit(model, "extra_layer")
    x, y = data()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x, training=True)))
    grads = hvdtrain.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    keras.optimizers.SGD(0.1).apply(grads, model.trainable_variables)
    print(f"trained extra_layer_tape {float(loss):.6f}", flush=True)


def load_twice(out):
    """(out: a directory every rank sees.)"""
    for number in (1, 2):
        trained = make_model()
        trained.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                        loss="mse")
        fit(trained, f"load_twice{number}_saved")
        if hvd.rank() == 0:
            trained.save(f"{out}/model{number}.keras")
        hvd.allreduce(0, name=f"saved{number}")  # the file is there for rank 0 to load
        if hvd.rank() == 0:
            model = hvd.load_model(f"{out}/model{number}.keras")
        else:  # a new model: other auto-generated names than the loaded one's
            model = make_model()
            model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                          loss="mse")
        fit(model, f"load_twice{number}")


def two_optimizers():
    models = [make_model(), make_model()]
    optimizers = [hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
                  for _ in models]
    x, y = data()

    @tf.function
    def step():
        for model, optimizer in zip(models, optimizers):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))
            optimizer.apply(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables)
        return loss

    for _ in range(4):
        loss = step()
    print(f"trained two_optimizers {float(loss):.6f}", flush=True)


