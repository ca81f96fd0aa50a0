"""One SGD step (lr 1) of a two-layer linear model on each rank's own
batch, by model.fit and by a DistributedGradientTape; writes to
OUT/<case>.rank<r>.npz each variable's own gradient (a plain tape) and its
update by fit and by the tape, so a test can tell which were averaged.

Cases (argv[2]): "partial_set": gradients reduced over process set [0, 1]
(the job has 3 ranks: rank 2 is outside it); "local": the second layer is
local (PartialDistributedOptimizer, register_local_source), its gradient
scaled as Horovod's scale_local_gradients says (argv[3]: "scaled" or not).
"""

import sys

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


OUT, CASE = sys.argv[1], sys.argv[2]
SCALED = sys.argv[3:] == ["scaled"]
partial_set = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[partial_set] if CASE == "partial_set" else None)
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")
options = {"process_set": partial_set} if CASE == "partial_set" else {}

model = make_model()
initial = [np.array(v) for v in model.trainable_variables]
with tf.GradientTape() as tape:
    loss = loss_of(model, x, y)
own = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]

if CASE == "local":
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[
        model.layers[1]], scale_local_gradients=SCALED)
else:
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), **options)
model.compile(optimizer=optimizer, loss="mse")
model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
by_fit = [np.array(v) - i for v, i in zip(model.trainable_variables, initial)]

model = make_model()
with tf.GradientTape() as tape:
    loss = loss_of(model, x, y)
tape = hvdtrain.DistributedGradientTape(tape, scale_local_gradients=SCALED, **options)
if CASE == "local":
    for variable in model.layers[1].trainable_weights:
        tape.register_local_source(variable)
keras.optimizers.SGD(1.0).apply(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables)
by_tape = [np.array(v) - i for v, i in zip(model.trainable_variables, initial)]
np.savez(f"{OUT}/{CASE}.rank{hvd.rank()}.npz", *own, *by_fit, *by_tape)
# A rank that ends shuts Horovod down on all: rank 2 (no collectives with
# the others) waits for them here.
hvd.allreduce(0, name="done")
