"""Synthetic batches for benchmarks: one random batch, repeated, so that the
input costs nothing and a benchmark measures the model and the exchange."""

import tensorflow as tf

from hvdtrain.data import sharding

__all__ = ["synthetic"]


def synthetic(shape, num_classes, batch_size, steps, dtype=tf.float32, seed=0):
    """`steps` batches per epoch of random features of `shape` and labels."""
    generator = tf.random.Generator.from_seed(seed)
    features = generator.normal((batch_size, *shape), dtype=dtype)
    labels = generator.uniform((batch_size,), maxval=num_classes, dtype=tf.int64)
    batch = tf.data.Dataset.from_tensors((features, labels))
    return sharding.ShardedDataset(lambda epoch: batch.repeat(steps), steps,
                                   examples=steps * batch_size, dropped=0)
