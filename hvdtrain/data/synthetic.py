"""Synthetic batches for benchmarks: one random batch, repeated, so that the
input costs nothing and a benchmark measures the model and the exchange."""

import tensorflow as tf

from hvdtrain.data import sharded_dataset

__all__ = ["synthetic"]


def synthetic(shape, num_classes, batch_size, steps, dtype=tf.float32, seed=0):
    """One random batch of features and labels, repeated `steps` times an epoch.

    Args:
        shape: The shape of one example's features (without the batch).
        num_classes: Labels are integers in [0, num_classes).
        batch_size: Examples per batch on this worker.
        steps: Batches per epoch.
        dtype: The features' dtype.
        seed: The seed of the random batch.

    Returns:
        A `ShardedDataset` of `steps` batches per epoch.
    """
    generator = tf.random.Generator.from_seed(seed)
    features = generator.normal((batch_size, *shape), dtype=dtype)
    labels = generator.uniform((batch_size,), maxval=num_classes, dtype=tf.int64)
    batch = tf.data.Dataset.from_tensors((features, labels))
    return sharded_dataset.ShardedDataset(lambda epoch: batch.repeat(steps), steps,
                                          examples=steps * batch_size, dropped=0)
