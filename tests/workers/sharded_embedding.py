"""Trains a small recommender (an embedding of 4 ids per example, averaged,
then a Dense layer) for STEPS steps with its table sharded across the ranks
(hvdtrain.layers.ShardedEmbedding, model.fit with DistributedOptimizer), and
a reference from the same start on the same batches:

- sgd, adagrad: the same model with a replicated keras.layers.Embedding,
  trained the same way (Keras's dense updates; the table's gradients are
  allgathered);
- adam: a replicated table updated by lazy_adam below, an independent NumPy
  implementation of lazy Adam, from the gradients allgathered by hand; the
  Dense layer by a plain Keras Adam on the allreduced gradients.

Ids come from ROWS rows (an odd number: the shards differ in size), so a
batch repeats ids and the ranks share some. `train(OPTIMIZER, PLACEMENT)`
runs on every rank, in a test's own process (tests/ranked/test_sharded_embedding.py).
"""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

import hvdtrain
from hvdtrain.layers import ShardedEmbedding
from hvdtrain.parallel import split_variables

ROWS, WIDTH, IDS, BATCH, STEPS, LR = 37, 4, 4, 8, 5, 0.1


def build(embedding):
    ids = keras.Input((IDS,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(embedding(ids))
    return keras.Model(ids, keras.layers.Dense(1, name="dense")(pooled))


def data():
    rng = np.random.default_rng(hvd.rank())
    x = rng.integers(0, ROWS, (STEPS * BATCH, IDS)).astype("int32")
    return x, rng.normal(size=(STEPS * BATCH, 1)).astype("float32")


def start(model, table):
    """The same table and Dense layer on every rank and in every model."""
    rng = np.random.default_rng(123)
    embedding = model.layers[1]
    if isinstance(embedding, ShardedEmbedding):
        split_variables.scatter([embedding.embeddings], [table])
    else:
        embedding.embeddings.assign(table)
    model.get_layer("dense").set_weights([rng.normal(size=(WIDTH, 1)).astype("float32"),
                                          np.zeros(1, "float32")])


def lazy_adam(table, m, v, rows, grad, t, lr, b1=0.9, b2=0.999, eps=1e-7):
    """One lazy Adam step on the rows given (each once), in place."""
    m[rows] = b1 * m[rows] + (1 - b1) * grad
    v[rows] = b2 * v[rows] + (1 - b2) * grad ** 2
    alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    table[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + eps)


def reference_adam(model, x, y):
    table = model.layers[1].embeddings
    dense = model.get_layer("dense").trainable_weights
    optimizer = keras.optimizers.Adam(LR)
    values = table.numpy().astype(np.float64)
    m, v = np.zeros_like(values), np.zeros_like(values)
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y[batch], model(x[batch]))
            loss = tf.reduce_mean(loss)
        table_grad, *dense_grads = tape.gradient(loss, [table, *dense])
        optimizer.apply([hvd.allreduce(g, op=hvd.Average, name=f"dense.{step}.{i}")
                         for i, g in enumerate(dense_grads)], dense)
        rows = hvd.allgather(table_grad.indices, name=f"rows.{step}").numpy()
        grads = hvd.allgather(table_grad.values, name=f"grads.{step}").numpy()
        unique, positions = np.unique(rows, return_inverse=True)
        summed = np.zeros((len(unique), WIDTH))
        np.add.at(summed, positions, grads)
        lazy_adam(values, m, v, unique, summed / hvd.size(), step + 1, LR)
        table.assign(values.astype(np.float32))


def train(name, placement="rows"):
    """The tables (the sharded one gathered whole) and the Dense kernels
    after training with optimizer `name`, and the rows of this rank's shard."""
    x, y = data()
    table = np.random.default_rng(7).normal(size=(ROWS, WIDTH)).astype("float32")
    sharded = build(ShardedEmbedding(ROWS, WIDTH, placement=placement, name="table"))
    replicated = build(keras.layers.Embedding(ROWS, WIDTH, name="table"))
    for model in (sharded, replicated):
        start(model, table)
    sharded.compile(hvdtrain.DistributedOptimizer(keras.optimizers.get(
        {"class_name": name, "config": {"learning_rate": LR}})), "mse")
    sharded.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    if name == "adam":
        reference_adam(replicated, x, y)
    else:
        replicated.compile(hvdtrain.DistributedOptimizer(keras.optimizers.get(
            {"class_name": name, "config": {"learning_rate": LR}})), "mse")
        replicated.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    table = sharded.layers[1].embeddings
    (whole,) = split_variables.gather([table], [table])
    return dict(sharded_table=whole,
                replicated_table=replicated.layers[1].embeddings.numpy(),
                sharded_dense=sharded.get_layer("dense").kernel.numpy(),
                replicated_dense=replicated.get_layer("dense").kernel.numpy(),
                shard_rows=sharded.layers[1].embeddings.shape[0])
