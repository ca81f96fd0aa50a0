"""Sharded pipelines from in-memory arrays: worker r of n takes rows r, r+n, ..."""

import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.data import sharded_dataset
from hvdtrain.errors import UsageError

__all__ = ["from_arrays"]


def from_arrays(arrays, batch_size, *, training, seed=0):
    """This worker's shard of in-memory arrays: rows r, r+n, ... on worker r of n.

    Args:
        arrays: A nest (e.g. a tuple `(features, labels)` or a dict) of
            arrays of equal length, one row per example.
        batch_size: Examples per batch on this worker.
        training: Whether the rows are for training: shuffled each epoch, in
            full batches, the same number on every worker. Otherwise every
            row once, the last batch possibly short.
        seed: The run's seed; each epoch's order derives from (seed, epoch).

    Returns:
        A `ShardedDataset`.

    Raises:
        UsageError: If the arrays differ in length, or a training worker
            cannot fill one batch (or, in evaluation, has no row).
    """
    lengths = {"/".join(map(str, path)) or "the array": len(a)
               for path, a in keras.tree.flatten_with_path(arrays)}
    if len(set(lengths.values())) > 1:
        raise UsageError("arrays of different lengths ("
                         + ", ".join(f"{name}: {n}" for name, n in lengths.items())
                         + "); give every feature and the labels one row per example")
    examples = len(tf.nest.flatten(arrays)[0])
    shard = tf.nest.map_structure(lambda a: a[layout.data_rank()::layout.data_size()], arrays)
    shard_examples = len(tf.nest.flatten(shard)[0])
    rows = tf.data.Dataset.from_tensor_slices(shard)
    if not training:
        return sharded_dataset.evaluation(lambda epoch: rows, shard_examples, examples, batch_size)

    def shuffled(epoch):
        return rows.shuffle(shard_examples, seed=sharded_dataset.epoch_seed(seed, epoch))

    return sharded_dataset.training(shuffled, shard_examples, examples, batch_size,
                                    layout.data_size())
