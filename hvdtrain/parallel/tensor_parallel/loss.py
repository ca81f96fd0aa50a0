"""Sparse categorical cross-entropy on logits split by vocabulary, never gathered.

Each rank holds the logits of its range of the vocabulary (a
`VocabParallelEmbedding` in reverse, or a `ColumnParallelDense` head). The
loss log(sum_j exp(z_j)) - z_target needs three numbers per position from
the whole vocabulary: the logits' maximum (an allreduce Max, for a stable
exp; no gradient), the sum of exps and the target's logit (allreduce Sum,
each rank's part entering once: Megatron-LM's g). A step then exchanges
three numbers per token instead of the vocabulary's logits.
"""

import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel.tensor_parallel import operators
from hvdtrain.parallel.tensor_parallel.vocab_embedding import vocabulary_range

__all__ = ["VocabParallelSparseCategoricalCrossentropy",
           "vocab_parallel_sparse_categorical_crossentropy"]


def vocab_parallel_sparse_categorical_crossentropy(y_true, y_pred, name="hvdtrain.tensor.loss"):
    """Per-position loss of integer targets `y_true` and this rank's slice
    `y_pred` of the logits (from_logits); the same value on every rank of a
    replica. `name`: a prefix for its collectives, one per use in a step."""
    logits = tf.cast(y_pred, tf.float32)
    targets = tf.cast(y_true, tf.int32)
    if len(targets.shape) == len(logits.shape):   # Keras's (..., 1) targets
        targets = tf.squeeze(targets, -1)
    most = operators.all_max(tf.reduce_max(logits, axis=-1), f"{name}.max")
    shifted = logits - most[..., None]
    total = operators.reduce_from_group(tf.reduce_sum(tf.exp(shifted), axis=-1),
                                        f"{name}.sum_exp")
    width = logits.shape[-1]
    first, _ = vocabulary_range(width * layout.tensor_size())
    local = targets - first
    mine = tf.logical_and(local >= 0, local < width)
    picked = tf.gather(shifted, tf.where(mine, local, tf.zeros_like(local)), batch_dims=len(
        local.shape))
    target = operators.reduce_from_group(tf.where(mine, picked, tf.zeros_like(picked)),
                                         f"{name}.target")
    return tf.math.log(total) - target


@keras.saving.register_keras_serializable(package="hvdtrain")
class VocabParallelSparseCategoricalCrossentropy(keras.losses.Loss):
    """`keras.losses.SparseCategoricalCrossentropy(from_logits=True)` for
    logits split by vocabulary over the replica's ranks; equal to it on the
    gathered logits, values and gradients.

    Args:
        reduction, name, dtype: As for `keras.losses.Loss`.
    """

    def __init__(self, reduction="sum_over_batch_size",
                 name="vocab_parallel_sparse_categorical_crossentropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        return vocab_parallel_sparse_categorical_crossentropy(
            y_true, y_pred, name=operators.collective_name(self.name, "loss"))
