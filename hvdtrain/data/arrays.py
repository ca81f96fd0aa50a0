"""Sharded tf.data pipelines from in-memory arrays."""

import math

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.data.sharding import ShardedDataset, agreed_train_steps


def from_arrays(arrays, batch_size, *, training, seed=0):
    """This worker's shard of `arrays` (a nest of arrays of equal length).

    Training: shuffled anew each epoch, full batches only, `steps` agreed by
    all workers. Evaluation: every example of the shard once, in order, the
    last batch possibly short.
    """
    examples = len(tf.nest.flatten(arrays)[0])
    shard = tf.nest.map_structure(lambda a: a[hvd.rank()::hvd.size()], arrays)
    shard_examples = len(tf.nest.flatten(shard)[0])
    ds = tf.data.Dataset.from_tensor_slices(shard)
    if training:
        steps = agreed_train_steps(shard_examples, batch_size, examples, hvd.size())
        ds = (ds.shuffle(shard_examples, seed=seed, reshuffle_each_iteration=True)
                .batch(batch_size, drop_remainder=True)
                .take(steps))
        dropped = examples - steps * batch_size * hvd.size()
    else:
        ds = ds.batch(batch_size)
        steps = math.ceil(shard_examples / batch_size)
        dropped = 0
    return ShardedDataset(ds.prefetch(tf.data.AUTOTUNE), steps, examples, dropped)
