"""Tensors between stages: activations forward, their gradients back, and
the last stage's outputs to the others.

Horovod has no point-to-point operation: a pass is an alltoall on the
2-rank process set of the two neighbours (hvdtrain.layout.neighbour_set), in
which the sender sends all it has to the other rank and the receiver sends
nothing (splits with zeros; on GPUs NCCL's send/recv). Both ranks call it
under the same explicit name.

A tensor travels as its bytes with its shape in front (the shape's int32s,
as bytes, then the values'), so the receiver needs to know neither the
micro-batch's rows nor the sizes the model leaves open (a sequence's
length), and every dtype goes the same way: Horovod's TensorFlow ops carry
no bfloat16, and bytes are lossless.

Horovod's ops are not stateful to TensorFlow, and Grappler treats them so:
- A send's result is empty and unused. Grappler turns an op whose results
  only control others into a no-op: the step must use it as data
  (`depending_on`).
- A collective whose inputs are all constants is run by constant folding
  while the graph is optimized, once, on each rank in its own order: two
  stages folding different passes first wait for each other forever. What a
  rank sends when it sends nothing is made at run time (`zeros`).
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import collectives

__all__ = ["depending_on", "from_last_stage", "receive", "send", "zeros"]


def send(tensor, offset, name):
    """Sends `tensor` to this rank's counterpart `offset` (+1: the next
    stage, -1: the previous one) stages on.

    Returns:
        The pass's (empty) result, for the step to depend on.
    """
    encoded = _encode(tensor)
    size = tf.size(encoded)
    # In the pair's set the earlier stage has the lower rank: set rank 0.
    splits = tf.stack([0, size]) if offset > 0 else tf.stack([size, 0])
    return _alltoall(encoded, splits, offset, name)


def receive(spec, offset, name):
    """What the counterpart `offset` stages on sends under `name`: a tensor
    like `spec` (a KerasTensor or tensor: its dtype and rank; its static
    sizes are kept)."""
    received = _alltoall(zeros([0], tf.uint8), tf.zeros([2], tf.int32), offset, name)
    return _decode(received, spec)


def from_last_stage(tensors, specs, name, after=()):
    """The last stage's `tensors` on every stage of the pipeline (`specs`:
    like them, for the other stages, which give None), once the passes
    `after` have run (`depending_on`)."""
    shared = []
    for j, (tensor, spec) in enumerate(zip(tensors, specs)):
        mine = zeros([0], tf.uint8) if tensor is None else _encode(tensor)
        if j == 0:
            mine = depending_on(mine, after)
        with collectives.root_name_scope():
            everyone = hvd.allgather(mine, name=f"{name}.{j}", ignore_name_scope=True,
                                     process_set=layout.pipeline_set())
        shared.append(_decode(everyone, spec))
    return shared


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


def _encode(tensor):
    """`tensor` as bytes: its shape's int32s, then its values."""
    tensor = tf.convert_to_tensor(tensor)
    shape = tf.bitcast(tf.shape(tensor, out_type=tf.int32), tf.uint8)
    if tensor.dtype == tf.bool:
        tensor = tf.cast(tensor, tf.uint8)
    values = tensor if tensor.dtype == tf.uint8 else tf.bitcast(tensor, tf.uint8)
    return tf.concat([tf.reshape(shape, [-1]), tf.reshape(values, [-1])], 0)


def _decode(encoded, spec):
    """The tensor `_encode` made, of `spec`'s dtype and rank."""
    dtype, rank = tf.as_dtype(spec.dtype), len(spec.shape)
    shape = tf.bitcast(tf.reshape(encoded[:4 * rank], [rank, 4]), tf.int32)
    values = encoded[4 * rank:]
    if dtype == tf.bool:
        values = tf.cast(values, tf.bool)
    elif dtype.size == 1:
        values = tf.bitcast(values, dtype)
    else:
        values = tf.bitcast(tf.reshape(values, [-1, dtype.size]), dtype)
    return tf.ensure_shape(tf.reshape(values, shape), spec.shape)


def _alltoall(tensor, splits, offset, name):
    with collectives.root_name_scope():
        output, _ = hvd.alltoall(tensor, splits=splits, name=name, ignore_name_scope=True,
                                 process_set=layout.neighbour_set(offset))
    return output
