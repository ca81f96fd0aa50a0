"""Megatron-LM's conjugate operators over the tensor-parallel group.

    copy_to_group      (f): identity forward, allreduce (sum) backward
    reduce_from_group  (g): allreduce (sum) forward, identity backward
    gather_from_group:      allgather along the last axis forward, this rank's slice backward
    split_to_group:         this rank's slice of the last axis forward, allgather backward

Horovod's registered gradients do not fit these (allreduce's gradient is
another allreduce, which multiplies g's by the group's size; allgather's
averages), so each is a `tf.custom_gradient` over Horovod's collective on
the group's process set. Every collective has an explicit name, the same on
every rank (Horovod matches operations by name): the caller's, one per
operation in a step.

Horovod's TensorFlow ops carry no bfloat16: reductions run in float32,
gathers move the 16-bit patterns as uint16 (lossless).
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import collectives

__all__ = ["all_max", "collective_name", "copy_to_group", "gather_from_group",
           "reduce_from_group", "split_to_group"]


def collective_name(owner, what):
    """The name of `owner`'s (a layer's) collective `what` in the current
    call (collectives.occurrence): the same on every rank of the group."""
    return f"hvdtrain.tensor.{collectives.occurrence_tag()}{owner}.{what}"


def copy_to_group(x, name):
    """f: `x` as it is; its gradient summed over the group (each rank's part
    of the layer that follows contributes its share)."""
    if layout.tensor_size() == 1:
        return x

    @tf.custom_gradient
    def copy(x):
        return tf.identity(x), lambda dy: _sum(dy, f"{name}.grad")

    return copy(x)


def reduce_from_group(x, name):
    """g: the sum of `x` over the group; its gradient passed through (every
    rank's partial sum enters the total once)."""
    if layout.tensor_size() == 1:
        return x

    @tf.custom_gradient
    def reduce(x):
        return _sum(x, name), tf.identity

    return reduce(x)


def gather_from_group(x, name):
    """The group's parts of the last axis, joined in rank order; the gradient
    of each rank's part is its slice of the whole's gradient."""
    size = layout.tensor_size()
    if size == 1:
        return x

    @tf.custom_gradient
    def gather(x):
        def backward(dy):
            return _own_slice(dy, size)

        return _gather_last_axis(x, size, name), backward

    return gather(x)


def split_to_group(x, name):
    """This rank's part of the last axis of `x` (the whole on every rank);
    the gradient gathered back from every rank's part."""
    size = layout.tensor_size()
    if size == 1:
        return x

    @tf.custom_gradient
    def split(x):
        def backward(dy):
            return _gather_last_axis(dy, size, f"{name}.grad")

        return _own_slice(x, size), backward

    return split(x)


def all_max(x, name):
    """The elementwise maximum of `x` over the group, without a gradient
    (vocabulary-parallel softmax's shift)."""
    x = tf.stop_gradient(x)
    return x if layout.tensor_size() == 1 else _allreduce(x, hvd.Max, name)


def _sum(x, name):
    return _allreduce(x, hvd.Sum, name)


def _allreduce(x, op, name):
    """`x` reduced over the group; bfloat16 in float32, which Horovod carries."""
    wide = tf.cast(x, tf.float32) if x.dtype == tf.bfloat16 else x
    with collectives.root_name_scope():
        reduced = hvd.allreduce(wide, op=op, name=name, ignore_name_scope=True,
                                process_set=layout.tensor_set())
    return tf.cast(reduced, x.dtype)


def _gather_last_axis(x, size, name):
    """Horovod gathers along the first axis: the last goes first for it."""
    rank_of_x = len(x.shape)
    last_first = tf.transpose(x, [rank_of_x - 1, *range(rank_of_x - 1)])
    bits = last_first.dtype == tf.bfloat16
    if bits:
        last_first = tf.bitcast(last_first, tf.uint16)
    with collectives.root_name_scope():
        gathered = hvd.allgather(last_first, name=name, ignore_name_scope=True,
                                 process_set=layout.tensor_set())
    if bits:
        gathered = tf.bitcast(gathered, tf.bfloat16)
    whole = tf.transpose(gathered, [*range(1, rank_of_x), 0])
    width = x.shape[-1]
    return tf.ensure_shape(whole, [*x.shape[:-1], None if width is None else width * size])


def _own_slice(x, size):
    width = x.shape[-1] // size
    start = layout.tensor_rank() * width
    return x[..., start:start + width]
