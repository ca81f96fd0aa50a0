"""A model's forward pass on a batch that may hold no examples.

Evaluation gives a model empty batches: a worker past the end of its shard
goes on taking steps with them (hvdtrain.data.sharded_dataset: a model whose
forward pass is a collective needs every worker in each step), and a
pipeline splits a short last batch into micro-batches some of which are
empty. Some TensorFlow kernels get zero rows wrong (in TF 2.21 on CPU,
oneDNN's convolutions return their input unchanged, and an LSTM cell fails
in its bias add), so the pass runs on one row of zeros instead, and its
outputs are cut back to the rows there are.
"""

import keras
import tensorflow as tf

__all__ = ["forward", "rows"]


def rows(inputs):
    """The examples in a batch (the first dimension of its first tensor)."""
    return tf.shape(next(t for t in keras.tree.flatten(inputs) if t is not None))[0]


def forward(call, inputs):
    """`call(inputs)`, run on at least one row: an empty batch is given a
    row of zeros, and the outputs keep only the batch's own rows."""
    count = rows(inputs)
    missing = tf.maximum(1 - count, 0)
    padded = keras.tree.map_structure(lambda t: _padded(t, missing), inputs)
    return keras.tree.map_structure(lambda t: t[:count], call(padded))


def _padded(tensor, missing):
    if not isinstance(tensor, tf.Tensor):
        return tensor   # None, or a ragged or sparse batch: left as it is
    padding = [[0, missing]] + [[0, 0]] * (tensor.shape.rank - 1)
    return tf.pad(tensor, padding, constant_values=tf.zeros((), tensor.dtype))
