"""Runs one update of a small model per variant of the gradient reduction and
writes each rank's weights before and after to OUT/<variant>.rank<r>.npz.

A variant (JSON) names: model ("dense" or "embedding"), loop ("fit" with
DistributedOptimizer, or "tape" with DistributedGradientTape), lr, passes
(backward passes per update), examples (in all, split over the workers),
shard (take only rows shard::2 of the data, for single-process references),
and options for the reduction. Every variant starts from the same weights.
"""

import json
import os
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvdtrain
from hvdtrain.reduction import OPS


def data(variant):
    rng = np.random.default_rng(0)
    n = variant["examples"]
    x = (rng.integers(0, 12, size=(n, 3)) if variant["model"] == "embedding"
         else rng.normal(size=(n, 6))).astype("float32")
    y = rng.normal(size=(n, 2)).astype("float32")
    if "shard" in variant:
        x, y = x[variant["shard"]::2], y[variant["shard"]::2]
    return x, y


def model(kind):
    keras.utils.set_random_seed(0)
    if kind == "embedding":
        body = [keras.Input((3,), dtype="int32"), keras.layers.Embedding(12, 4),
                keras.layers.Flatten()]
    else:
        body = [keras.Input((6,)), keras.layers.Dense(8, activation="tanh")]
    return keras.Sequential(body + [keras.layers.Dense(2)])


def reduction_options(options, variables):
    options = dict(options)
    if "op" in options:
        options["op"] = OPS[options["op"]]
    if "compression" in options:
        options["compression"] = getattr(hvdtrain.Compression, options["compression"])
    if options.get("groups") == "first_layer":
        options["groups"] = [variables[:2]]
    if options.pop("own_process_set", False):
        options["process_set"] = PROCESS_SETS[hvdtrain.rank()]
    return options


def run(variant):
    net = model(variant["model"])
    x, y = data(variant)
    batch = len(x) // hvdtrain.size() // variant["passes"]
    sharded = hvdtrain.data.from_arrays((x, y), batch, training=True)
    assert sharded.steps == variant["passes"] and sharded.dropped == 0
    initial = net.get_weights()
    sgd = keras.optimizers.SGD(variant["lr"])
    options = reduction_options(variant.get("options", {}), net.trainable_variables)
    if variant["loop"] == "fit":
        net.compile(optimizer=hvdtrain.DistributedOptimizer(
            sgd, backward_passes_per_step=variant["passes"], **options), loss="mse")
        net.fit(sharded.for_epochs(1), epochs=1, steps_per_epoch=sharded.steps, verbose=0)
    else:
        for xb, yb in sharded.batches(0):
            with tf.GradientTape() as tape:
                loss = keras.losses.mean_squared_error(yb, net(xb, training=True))
                loss = tf.reduce_mean(loss)
            tape = hvdtrain.DistributedGradientTape(tape, **options)
            sgd.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)
    np.savez(f"{OUT}/{variant['name']}.rank{hvdtrain.rank()}.npz", *initial, *net.get_weights())


OUT = sys.argv[1]
VARIANTS = json.loads(sys.argv[2])
# One process set per rank (a rank reducing alone), made at init: the
# launcher says how many ranks there are (Gloo: HOROVOD_SIZE, MPI: OMPI_...).
SIZE = int(os.environ.get("HOROVOD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
PROCESS_SETS = [hvd.ProcessSet([r]) for r in range(SIZE)] if SIZE > 1 else []
hvdtrain.init(process_sets=PROCESS_SETS or None)
for variant in VARIANTS:
    run(variant)
# A rank that ends shuts Horovod down on every rank. Ranks reducing in
# process sets of their own do not wait for each other: the first done
# would end the other's reductions ("Process set does not exist").
if hvdtrain.size() > 1:
    hvd.allreduce(tf.constant(0), name="variants.done")
