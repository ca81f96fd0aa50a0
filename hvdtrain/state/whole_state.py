"""The training state as one whole on rank 0, wherever its parts live.

Checkpoints and exports treat the state as one list of whole variables; the
workers hold it in parts:
- a tensor-parallel weight or a sharded table is split over the ranks of
  a stage (hvdtrain.parallel.split_variables brings it whole to the stage's first
  rank, and back);
- with pipeline parallelism each stage holds its own layers and their
  optimizer state: the stages' leaders (each stage's rank in replica 0 at
  tensor-parallel rank 0: `layout.stage_leaders()`) send their whole
  variables to rank 0, stage by stage, and take them back.

The whole state is every stage's variables in stage order (without a
pipeline, the one stage's). A stage's values travel as one buffer of bytes:
rank 0 holds one stage's state in flight, in host memory.
"""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import collectives, pipeline_parallel, split_variables

__all__ = ["describe", "gather", "plain_model", "scatter"]


def plain_model(model):
    """`model` as one plain Keras model on rank 0, for exporting and serving
    without hvdtrain: a pipeline's stages joined, each with its leader's
    weights; split weights whole in the plain layers they split
    (split_variables.replicated_copy). Call it on every rank.

    Returns:
        The model on rank 0 (uncompiled where it is a copy); None on the
        other ranks.
    """
    if not isinstance(model, pipeline_parallel.Pipeline):
        return split_variables.replicated_copy(model)
    weights = model.weights
    described = describe(weights)
    values = gather(weights, weights, name="hvdtrain.export")
    if hvd.rank() != 0:
        return None
    whole = model.whole
    # The whole model, in host memory: it need not fit one device.
    with tf.device("/CPU:0"):
        pipeline_parallel.on_host(whole.variables)   # seed generators' states too
        return split_variables.plain_copy(whole, {path: value for (path, _, _), value
                                                  in zip(described, values)})


def describe(variables):
    """[(path, whole shape, dtype name)] of the whole state, on rank 0
    (None on the other ranks). Call it on every rank with its own
    variables."""
    stages = _stages_entries(variables)
    return [entry for stage in stages for entry in stage] if hvd.rank() == 0 else None


def gather(variables, values, name):
    """The whole state on rank 0: every stage's `values` (of its
    `variables`), split ones whole, as NumPy arrays in stage order; None on
    the other ranks. Call it on every rank with its own variables."""
    values = split_variables.gather(variables, values, name=f"{name}.stage{layout.pipeline_rank()}",
                                    process_set=layout.stage_set())
    if hvd.rank() not in layout.stage_leaders():
        return None
    values = [np.asarray(keras.ops.convert_to_numpy(v)) for v in values]
    if layout.pipeline_size() == 1:
        return values
    stages = _stages_entries(variables)
    whole = list(values)
    for stage in range(1, layout.pipeline_size()):
        sending = _bytes(values) if layout.pipeline_rank() == stage else _NOTHING
        received = _pass(sending, _size(stages[stage]), 0, f"{name}.from_stage{stage}")
        if hvd.rank() == 0:
            whole += _arrays(received, stages[stage])
    return whole if hvd.rank() == 0 else None


def scatter(variables, values, name):
    """Sets every rank's `variables` from the whole state `values` on rank 0
    (in `gather`'s order): each stage's leader takes its whole variables,
    and every rank of its stage (each replica's, each tensor-parallel
    rank's) its unsplit ones from the leader and its parts of split ones.
    Call it on every rank with its own variables; `values` is read on rank
    0 only."""
    leading = hvd.rank() in layout.stage_leaders()
    if leading and layout.pipeline_size() > 1:
        stages = _stages_entries(variables)
        counts = np.cumsum([0, *map(len, stages)])
        for stage in range(1, layout.pipeline_size()):
            sending = (_bytes(values[counts[stage]:counts[stage + 1]]) if hvd.rank() == 0
                       else _NOTHING)
            received = _pass(sending, _size(stages[stage]), stage, f"{name}.to_stage{stage}")
            if layout.pipeline_rank() == stage:
                values = _arrays(received, stages[stage])
    unsplit = [v for v in variables if not split_variables.is_sharded(v)]
    if leading:
        for variable, value in zip(variables, values):
            if not split_variables.is_sharded(variable):
                variable.assign(value)
    stage = f"{name}.stage{layout.pipeline_rank()}"
    collectives.broadcast_over(unsplit, layout.stage_set(), layout.stage_leaders()[
        layout.pipeline_rank()], name=f"{stage}.unsplit")
    split_variables.scatter(variables, values, name=stage, process_set=layout.stage_set())


_NOTHING = np.zeros(0, np.uint8)
_PIECE = 1 << 30   # bytes per alltoall


def _stages_entries(variables):
    """[[(path, whole shape, dtype name)] of each stage], on the stages'
    leaders (None on the other ranks)."""
    mine = [(v.path, tuple(split_variables.logical_shape(v)), str(v.dtype)) for v in variables]
    if hvd.rank() not in layout.stage_leaders():
        return None
    if layout.pipeline_size() == 1:
        return [mine]
    return hvd.allgather_object(mine, name="hvdtrain.state.describe",
                                process_set=layout.pipeline_set())


def _pass(sending, size, target, name):
    """`sending` (`size` bytes, from one stage's leader; nothing from the
    others) to the leader of stage `target`, in pieces Horovod's 32-bit
    splits can count; every leader takes part. Returns what `target`
    received (the others: nothing)."""
    leaders = layout.pipeline_set()
    pieces = []
    for piece, start in enumerate(range(0, size, _PIECE)):
        part = sending[start:start + _PIECE]
        splits = [0] * leaders.size()
        splits[target] = len(part)
        received, _ = hvd.alltoall(part, splits=splits, name=f"{name}.{piece}",
                                   process_set=leaders)
        pieces.append(received.numpy())
    return np.concatenate(pieces) if pieces else _NOTHING


def _size(entries):
    """The bytes of the arrays `entries` describe."""
    return sum(_length(shape, dtype) for _, shape, dtype in entries)


def _length(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(dtype).itemsize


def _numpy_dtype(name):
    return np.dtype(tf.as_dtype(name).as_numpy_dtype)


def _bytes(arrays):
    if not arrays:
        return _NOTHING
    return np.concatenate([np.ascontiguousarray(a).view(np.uint8).ravel() for a in arrays])


def _arrays(buffer, entries):
    """The arrays of `entries` ((path, shape, dtype name)) out of one buffer."""
    arrays, offset = [], 0
    for _, shape, dtype in entries:
        length = _length(shape, dtype)
        arrays.append(buffer[offset:offset + length].view(_numpy_dtype(dtype)).reshape(shape)
                      .copy())
        offset += length
    return arrays
