"""Horovod collectives on Keras 3 objects.

Horovod's own `broadcast_variables` expects tf.Variables and fails on Keras 3
variables; these helpers broadcast the values inside one tf.function (so
Horovod negotiates them together) and assign them on every rank.
"""

import contextlib
import contextvars

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import split_variables

__all__ = ["agree_on_max", "agree_on_min", "allreduce_scalars", "broadcast_over",
           "broadcast_variables", "occurrence", "occurrence_tag", "raise_together",
           "root_name_scope"]

_occurrence = contextvars.ContextVar("occurrence", default="")


def root_name_scope():
    """The graph's top-level name scope while tracing (nothing when eager).

    Horovod keys a collective by its op's full name, and an enclosing name
    scope can hold names that differ between ranks (a model's or layer's).

    Returns:
        A context manager.
    """
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.compat.v1.get_default_graph().name_scope(None)


@contextlib.contextmanager
def occurrence(tag):
    """Names the collectives of layers called inside (`occurrence_tag`) as
    those of the call `tag`, e.g. a micro-batch's, apart from the same
    layers' other calls in the step."""
    token = _occurrence.set(f"{tag}.")
    try:
        yield
    finally:
        _occurrence.reset(token)


def occurrence_tag():
    """The current `occurrence`'s part of a collective's name ("" outside any)."""
    return _occurrence.get()


def broadcast_variables(variables, root_rank=0):
    """Sets `variables` on every rank to their values on `root_rank`.

    Call it on every rank, with the same variables in the same order: they
    are broadcast by position. Does nothing on one process. Shards of a
    table split across the workers (hvdtrain.parallel.split_variables) are left out: each
    worker holds its own rows. Parts of tensor-parallel weights, and every
    variable of a pipeline's stage, go from replica 0 to the same part of
    every other replica (`root_rank` is then replica 0).

    Args:
        variables: Keras or TensorFlow variables (e.g. `model.variables`
            and `optimizer.variables`).
        root_rank: The rank whose values all take.
    """
    variables = list(variables)
    whole = [v for v in variables if not split_variables.is_sharded(v)]
    parts = [v for v in variables
             if isinstance(split_variables.placement_of(v), split_variables.TensorSplit)]
    if layout.pipeline_size() > 1:
        # Each stage holds its own variables: they go from replica 0 to the
        # same stage of every other replica.
        parts, whole = whole + parts, []
    if hvd.size() > 1 and whole:
        _assign(whole, _broadcast([tf.convert_to_tensor(v) for v in whole], root_rank,
                                  hvd.global_process_set, "hvdtrain.broadcast"))
    if layout.data_size() > 1 and parts:
        # The first member of this rank's data-parallel group: its part in replica 0.
        _assign(parts, _broadcast([tf.convert_to_tensor(v) for v in parts],
                                  layout.current().data_group(hvd.rank())[0], layout.data_set(),
                                  "hvdtrain.broadcast.parts"))


def broadcast_over(variables, process_set, root_rank, name):
    """Sets `variables` on every rank of `process_set` to their values on
    its member `root_rank` (a global rank). Call it on every rank of the
    set, with the same variables in the same order."""
    variables = list(variables)
    if process_set.size() > 1 and variables:
        _assign(variables, _broadcast([tf.convert_to_tensor(v) for v in variables], root_rank,
                                      process_set, name))


def _assign(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value)


@tf.function(reduce_retracing=True)
def _broadcast(values, root_rank, process_set, name):
    return [hvd.broadcast(v, root_rank, name=f"{name}.{i}", ignore_name_scope=True,
                          process_set=process_set)
            for i, v in enumerate(values)]


def allreduce_scalars(values, op=hvd.Average, name="hvdtrain.scalars"):
    """Reduces a list of Python numbers across ranks with one allreduce.

    Args:
        values: Numbers, as many on every rank.
        op: A Horovod reduction (`hvd.Average`, `hvd.Sum`, ...).
        name: The collective's name, the same on every rank.

    Returns:
        A list of floats, the same on every rank.
    """
    if hvd.size() == 1:
        return list(values)
    reduced = hvd.allreduce(tf.constant(values, tf.float64), op=op, name=name)
    return [float(v) for v in np.asarray(reduced)]


def agree_on_min(value, name="hvdtrain.min"):
    """The smallest of an integer that each rank computed for itself.

    Args:
        value: This rank's integer.
        name: The collective's name, the same on every rank.

    Returns:
        The smallest `value` of all ranks, as an int.
    """
    return _agree(value, hvd.Min, name)


def agree_on_max(value, name="hvdtrain.max"):
    """The largest of an integer that each rank computed for itself (as
    agree_on_min)."""
    return _agree(value, hvd.Max, name)


def _agree(value, op, name):
    if hvd.size() == 1:
        return int(value)
    return int(hvd.allreduce(tf.constant(int(value), tf.int64), op=op, name=name))


def raise_together(error):
    """Raises on every rank the error of the first rank that has one.

    A problem one rank finds in its own part of the data then ends all
    ranks with the same message instead of leaving the others waiting.
    Call it on every rank.

    Args:
        error: This rank's exception, or None.

    Raises:
        Exception: Of the first failing rank's type, with its message and
            "(found by rank N)" when there are several processes.
    """
    if hvd.size() == 1:
        if error is not None:
            raise error
        return
    errors = hvd.allgather_object(None if error is None else (type(error), str(error)),
                                  name="hvdtrain.errors")
    for rank, found in enumerate(errors):
        if found is not None:
            kind, message = found
            raise kind(f"{message} (found by rank {rank})")
