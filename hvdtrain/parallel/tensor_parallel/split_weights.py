"""The weights of tensor-parallel layers: each rank's part of a whole weight.

A layer declares the whole weight and the axis it is split along; each rank
of a replica holds one of T equal, contiguous parts (split_variables.TensorSplit).
A part starts as its slice of the whole weight's initial value, drawn with
the whole shape: the model at any T starts where the unsplit one does
(same seed, same weights), and fan-based initializers see the whole fans.
"""

import horovod.tensorflow as hvd
import numpy as np

from hvdtrain import layout
from hvdtrain.errors import UsageError
from hvdtrain.parallel import split_variables

__all__ = ["add_split_weight", "check_divisible", "set_whole_weights"]


def check_divisible(layer, what, value):
    """Refuses a size that the replicas' ranks cannot share equally."""
    parts = layout.tensor_size()
    if value % parts:
        raise UsageError(f"{type(layer).__name__} '{layer.name}': {what} {value} does not split "
                         f"over --tensor_parallel={parts} ranks; make it a multiple of {parts} "
                         "or choose a --tensor_parallel that divides it")


def add_split_weight(layer, name, shape, axis, initializer):
    """Adds this rank's part of a whole weight of `shape`, split along `axis`.

    Returns:
        The Keras variable holding the part, marked with its TensorSplit
        when the replica has more than one rank.
    """
    parts, rank = layout.tensor_size(), layout.tensor_rank()
    part_shape = list(shape)
    part_shape[axis] //= parts

    def part_of_whole(part_shape, dtype=None):
        whole = initializer(tuple(shape), dtype=dtype)
        if parts == 1:
            return whole
        return np.split(np.asarray(whole), parts, axis=axis)[rank]

    variable = layer.add_weight(shape=tuple(part_shape), name=name, initializer=part_of_whole,
                                trainable=True)
    if parts > 1:
        split_variables.mark(variable, split_variables.TensorSplit(axis, parts))
    return variable


def set_whole_weights(model, weights):
    """Sets `model`'s weights from whole values (e.g. an unsplit model's
    `get_weights()`, in the same order): each rank takes its part. No
    collective: every rank must hold all of `weights`."""
    variables = model.weights
    if len(variables) != len(weights):
        raise UsageError(f"set_whole_weights: {len(weights)} values for {len(variables)} weights")
    for variable, value in zip(variables, weights):
        placement = split_variables.placement_of(variable)
        value = np.asarray(value)
        if placement is not None:
            value = placement.part(value, hvd.rank(), hvd.size())
        variable.assign(value)
