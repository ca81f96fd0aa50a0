"""Reduces each rank's own gradients of a small model with
DistributedGradientTape(op=hvd.Adasum): `gradients` gives the local
gradients of every rank and the reduced ones
(tests/ranked/test_collective_limits.py)."""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvdtrain


def gradients():
    """[each variable's gradients of every rank (stacked)], [its reduced gradient]."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    rng = np.random.default_rng(hvdtrain.rank())
    x, y = rng.normal(size=(8, 6)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))
    local = tape.gradient(loss, model.trainable_variables)
    reduced = hvdtrain.DistributedGradientTape(tape, op=hvd.Adasum).gradient(
        loss, model.trainable_variables)
    gathered = [hvd.allgather(g[tf.newaxis]) for g in local]
    return [g.numpy() for g in gathered], [g.numpy() for g in reduced]
