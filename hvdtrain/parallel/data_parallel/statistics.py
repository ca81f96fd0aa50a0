"""Statistics each worker keeps of its own batches, made one.

Batch normalization's moving mean and variance are not trained: each
worker updates its own from the batches it sees, so the replicas' copies
drift apart. Validation would then score each shard with its own worker's
statistics while checkpoints and the exported model keep rank 0's. Before
each of those (callbacks.ExactEvaluation, PeriodicCheckpoint, the trainer's
export) every replica takes their average: a moving average of the batches'
means is linear in them, so the average of the replicas' is the moving
average of the global batch's (for the variance, of the replicas' own).
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import split_variables

__all__ = ["average_statistics"]


def average_statistics(model):
    """Sets each of `model`'s non-trainable floating-point weights to its
    average over the data-parallel replicas. Call it on every rank.

    Averaged in float64, the value the replicas already share (a frozen
    layer's weights) comes back bit for bit.
    """
    if layout.data_size() == 1:
        return
    kept = [v for v in model.non_trainable_weights
            if tf.as_dtype(v.dtype).is_floating and not split_variables.is_rows_sharded(v)]
    if not kept:
        return
    summed = hvd.grouped_allreduce([tf.cast(v, tf.float64) for v in kept], op=hvd.Sum,
                                   name="hvdtrain.statistics", process_set=layout.data_set())
    for variable, total in zip(kept, summed):
        variable.assign(tf.cast(total / layout.data_size(), variable.dtype))
