"""One SGD step (lr 1) of a two-layer linear model on each rank's own
batch, by model.fit and by a DistributedGradientTape: each variable's own
gradient (a plain tape) and its update by fit and by the tape, so a test
can tell which were averaged (tests/ranked/test_reduction.py).

Cases: "partial_set": gradients reduced over a process set the caller
makes (e.g. [0, 1] of 3 ranks: rank 2 is outside it); "local": the second
layer is local (PartialDistributedOptimizer, register_local_source), its
gradient scaled as Horovod's scale_local_gradients says.
"""

import keras
import numpy as np
import tensorflow as tf

import hvdtrain
import hvdtrain.keras as hvd


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])


def loss_of(model, x, y):
    return tf.reduce_mean(keras.losses.mean_squared_error(y, model(x, training=True)))


def steps(case, scaled=False, process_set=None):
    """[own gradients, update by fit, update by the tape], each a list per variable."""
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")
    options = {"process_set": process_set} if process_set is not None else {}

    model = make_model()
    initial = [np.array(v) for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
    own = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]

    if case == "local":
        optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[
            model.layers[1]], scale_local_gradients=scaled)
    else:
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), **options)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    by_fit = [np.array(v) - i for v, i in zip(model.trainable_variables, initial)]

    model = make_model()
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
    tape = hvdtrain.DistributedGradientTape(tape, scale_local_gradients=scaled, **options)
    if case == "local":
        for variable in model.layers[1].trainable_weights:
            tape.register_local_source(variable)
    keras.optimizers.SGD(1.0).apply(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables)
    by_tape = [np.array(v) - i for v, i in zip(model.trainable_variables, initial)]
    return own, by_fit, by_tape
