"""Tensors between neighbouring stages: activations forward, their
gradients back.

Horovod has no point-to-point operation: a pass is an alltoall on the
2-rank process set of the two neighbours (hvdtrain.layout.neighbour_set), in
which the sender sends all its rows to the other rank and the receiver sends
none (splits with zeros; on GPUs NCCL's send/recv). Both ranks call it under
the same explicit name.

Horovod's ops are not stateful to TensorFlow, and Grappler treats them so:
- A send's result is empty and unused. Grappler turns an op whose results
  only control others into a no-op: the step must use it as data
  (`depending_on`).

- A collective whose inputs are all constants is run by constant folding
  while the graph is optimized, once, on each rank in its own order: two
  stages folding different passes first wait for each other forever. What a
  rank sends when it sends nothing is made at run time (`zeros`).

Horovod's TensorFlow ops carry no bfloat16: such tensors travel as their
16-bit patterns (uint16), losslessly.
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import collectives

__all__ = ["depending_on", "receive", "send", "zeros"]


def send(tensor, offset, name):
    """Sends `tensor` to this rank's counterpart `offset` (+1: the next
    stage, -1: the previous one) stages on.

    Returns:
        The pass's (empty) result, for the step to depend on.
    """
    rows = tf.shape(tensor)[0]
    # In the pair's set the earlier stage has the lower rank: set rank 0.
    splits = tf.stack([0, rows]) if offset > 0 else tf.stack([rows, 0])
    return _alltoall(tensor, splits, offset, name)


def receive(shape, dtype, offset, name):
    """What the counterpart `offset` stages on sends under `name`: a tensor
    of `shape` (its first dimension, the micro-batch, unknown) and `dtype`."""
    nothing = zeros([0, *shape[1:]], dtype)
    received = _alltoall(nothing, tf.zeros([2], tf.int32), offset, name)
    return tf.ensure_shape(received, [None, *shape[1:]])


def depending_on(tensor, sent):
    """`tensor`, computed after the passes `sent` (their empty results)
    have run: each one's size (0, unknown to the graph) is added to it."""
    if not sent:
        return tensor
    nothing = tf.add_n([tf.size(result) for result in sent])
    return tensor + tf.cast(nothing, tensor.dtype)


def zeros(shape, dtype):
    """Zeros of `shape` made when the step runs: a stateful op, which
    Grappler neither folds into a constant nor merges with another."""
    return tf.raw_ops.Empty(shape=shape, dtype=dtype, init=True)


def _alltoall(tensor, splits, offset, name):
    bits = tensor.dtype == tf.bfloat16
    if bits:
        tensor = tf.bitcast(tensor, tf.uint16)
    with collectives.root_name_scope():
        output, _ = hvd.alltoall(tensor, splits=splits, name=name, ignore_name_scope=True,
                                 process_set=layout.neighbour_set(offset))
    return tf.bitcast(output, tf.bfloat16) if bits else output
