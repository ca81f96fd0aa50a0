"""One update of a small model per variant of the gradient reduction:
`run(variant)` in a test's own process (tests/ranked/test_reduction.py), or
`python variants.py OUT VARIANTS` for single-process references, writing
each variant's weights before and after to OUT/<variant>.rank0.npz.

A variant (JSON) names: model ("dense" or "embedding"), loop ("fit" with
DistributedOptimizer, or "tape" with DistributedGradientTape), lr, passes
(backward passes per update), examples (in all, split over the workers),
shard (take only rows shard::2 of the data, for single-process references),
and options for the reduction. Every variant starts from the same weights.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdtrain
from hvdtrain.parallel.data_parallel.reduction import OPS


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


def reduction_options(options, variables, process_sets):
    options = dict(options)
    if "op" in options:
        options["op"] = OPS[options["op"]]
    if "compression" in options:
        options["compression"] = getattr(hvdtrain.Compression, options["compression"])
    if options.get("groups") == "first_layer":
        options["groups"] = [variables[:2]]
    if options.pop("own_process_set", False):
        options["process_set"] = process_sets[hvdtrain.rank()]
    return options


def run(variant, process_sets=()):
    """The weights (initial, after the update) of `variant`; `process_sets`:
    one per rank (the "own_process_set" option)."""
    net = model(variant["model"])
    x, y = data(variant)
    batch = len(x) // hvdtrain.size() // variant["passes"]
    sharded = hvdtrain.data.from_arrays((x, y), batch, training=True)
    assert sharded.steps == variant["passes"] and sharded.dropped == 0
    initial = net.get_weights()
    sgd = keras.optimizers.SGD(variant["lr"])
    options = reduction_options(variant.get("options", {}), net.trainable_variables,
                                process_sets)
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
    return initial, net.get_weights()


if __name__ == "__main__":
    hvdtrain.init()
    for variant in json.loads(sys.argv[2]):
        initial, after = run(variant)
        np.savez(f"{sys.argv[1]}/{variant['name']}.rank0.npz", *initial, *after)
