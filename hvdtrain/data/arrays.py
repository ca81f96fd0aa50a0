"""Sharded pipelines from in-memory arrays: worker r of n takes rows r, r+n, ..."""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.data import sharding


def from_arrays(arrays, batch_size, *, training, seed=0):
    """This worker's shard of `arrays` (a nest of arrays of equal length)."""
    examples = len(tf.nest.flatten(arrays)[0])
    shard = tf.nest.map_structure(lambda a: a[hvd.rank()::hvd.size()], arrays)
    shard_examples = len(tf.nest.flatten(shard)[0])
    if not training:
        rows = tf.data.Dataset.from_tensor_slices(shard)
        return sharding.evaluation(lambda epoch: rows, shard_examples, examples, batch_size)
    tensors = tf.nest.map_structure(tf.constant, shard)

    def shuffled(epoch):
        order = sharding.permutation(shard_examples, seed, epoch)
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda i: tf.nest.map_structure(lambda t: tf.gather(t, i), tensors))

    return sharding.training(shuffled, shard_examples, examples, batch_size, hvd.size())
