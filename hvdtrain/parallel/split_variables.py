"""Variables split across workers: where each part lives, and the whole
variable out of its parts and back.

Two ways to split one:
- `Placement`: an embedding table of hvdtrain.layers.ShardedEmbedding (and
  the optimizer's slots for it) by rows over all workers, each holding the
  rows its placement gives it, in increasing row order;
- `TensorSplit`: a weight of a tensor-parallel layer (hvdtrain.parallel.tensor_parallel)
  cut along one axis into T equal parts, part t on the replicas' rank t
  (hvdtrain.layout); every replica holds the same parts.

Everything that treats the state as one thing (checkpoints, export) sees the
whole variable, which does not depend on the number of workers or their
layout: a checkpoint written by N workers resumes on M, at any T.

Rank 0 writes checkpoints and exports, and their directory need not be
shared between hosts, so `gather` brings the whole variable to rank 0, one
worker's part at a time, and `scatter` sends each worker its part back.
Rank 0 thus holds one variable in host memory while it saves, never all
workers' device memory.
"""

import dataclasses

import horovod.tensorflow as hvd
import keras
import numpy as np

__all__ = ["NO_XLA", "NO_XLA_TENSOR_PARALLEL", "Placement", "TensorSplit", "gather",
           "has_rows_sharded", "has_shards", "is_rows_sharded", "is_sharded", "logical_shape",
           "mark", "placement_of", "plain_copy", "replicated_copy", "scatter"]

# Why a model with sharded variables is not compiled with XLA.
NO_XLA = ("tables sharded across workers (ShardedEmbedding) exchange rows inside the forward "
          "pass, which XLA cannot hold (Horovod's collectives have no XLA kernels); leave "
          "--jit_compile off")

# Why a model with tensor-parallel layers is not.
NO_XLA_TENSOR_PARALLEL = (
    "tensor-parallel layers exchange activations inside the forward pass, which XLA cannot "
    "hold (Horovod's collectives have no XLA kernels there); leave --jit_compile off")

_ATTRIBUTE = "_hvdtrain_placement"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which worker holds which rows of a table of `rows` rows.

    Row-wise (`owner` None): row r lives on worker r % N as its local row
    r // N, so the rows a batch looks up spread evenly. Table-wise: every
    row lives on worker `owner`; the others hold none.
    """
    rows: int
    owner: int | None = None

    def shard_rows(self, rank, size):
        """How many rows worker `rank` of `size` holds."""
        if self.owner is None:
            return len(range(rank, self.rows, size))
        return self.rows if rank == self.owner % size else 0

    def owned_rows(self, rank, size):
        """The table's rows that worker `rank` of `size` holds, in its order."""
        if self.owner is None:
            return np.arange(rank, self.rows, size)
        return np.arange(self.rows if rank == self.owner % size else 0)

    def whole_shape(self, shape):
        return (self.rows, *shape[1:])

    def holders(self, size):
        """The ranks whose parts make up the whole."""
        return range(size)

    def part(self, whole, rank, size):
        """Worker `rank`'s part of the whole value."""
        return whole[self.owned_rows(rank, size)]

    def place(self, whole, part, rank, size):
        """Writes worker `rank`'s part into the whole value."""
        whole[self.owned_rows(rank, size)] = part


@dataclasses.dataclass(frozen=True)
class TensorSplit:
    """A weight cut along `axis` into `parts` equal, contiguous parts: part t
    on the ranks t, t + parts, ... (tensor-parallel rank t of every replica)."""
    axis: int
    parts: int

    def whole_shape(self, shape):
        shape = list(shape)
        shape[self.axis] *= self.parts
        return tuple(shape)

    def holders(self, size):
        return range(self.parts)   # replica 0 holds every part

    def part(self, whole, rank, size):
        return np.split(whole, self.parts, axis=self.axis)[rank % self.parts]

    def place(self, whole, part, rank, size):
        length = part.shape[self.axis]
        index = [slice(None)] * whole.ndim
        index[self.axis] = slice(rank % self.parts * length, (rank % self.parts + 1) * length)
        whole[tuple(index)] = part


def mark(variable, placement):
    """Records that `variable` holds this worker's shard of a table placed so."""
    setattr(variable, _ATTRIBUTE, placement)
    return variable


def placement_of(variable):
    """The variable's Placement or TensorSplit, or None for a variable every
    worker holds whole."""
    return getattr(variable, _ATTRIBUTE, None)


def is_sharded(variable):
    """Whether this worker holds only a part of `variable`."""
    return placement_of(variable) is not None


def is_rows_sharded(variable):
    """Whether `variable` is a table split by rows (sparse updates, no reduction)."""
    return isinstance(placement_of(variable), Placement)


def has_shards(model):
    """Whether any of `model`'s variables is a part of a whole."""
    return any(is_sharded(v) for v in model.variables)


def has_rows_sharded(model):
    """Whether `model` has tables split by rows (ShardedEmbedding)."""
    return any(is_rows_sharded(v) for v in model.variables)


def logical_shape(variable):
    """The shape of the whole variable: the table's, for a shard."""
    placement = placement_of(variable)
    shape = tuple(variable.shape)
    return shape if placement is None else placement.whole_shape(shape)


def gather(variables, values, name="hvdtrain.shards", process_set=hvd.global_process_set):
    """The whole values of the split ones among `variables`, on rank 0 of
    `process_set`.

    Call it on every rank of the set with the same variables in the same
    order.

    Args:
        variables: Keras variables, split or not.
        values: Their values to use (tensors or arrays), in the same order.
        name: A prefix for the collectives' names.
        process_set: The ranks whose parts make up the whole variables (a
            pipeline stage's; all of them without a pipeline), ranked
            within it.

    Returns:
        `values` with each part replaced by the whole value (a NumPy array)
        on the set's rank 0; on its other ranks, parts become None.
    """
    size, rank = process_set.size(), process_set.rank()
    gathered = []
    for index, (variable, value) in enumerate(zip(variables, values)):
        placement = placement_of(variable)
        if placement is None:
            gathered.append(value)
            continue
        part = np.asarray(keras.ops.convert_to_numpy(value))
        whole = (np.empty(placement.whole_shape(part.shape), part.dtype) if rank == 0
                 else None)
        if rank == 0:
            placement.place(whole, part, 0, size)
        for source in placement.holders(size):
            if source == 0:
                continue
            # Only `source` sends, and only to rank 0: one part in flight.
            sending = part if rank == source else part[:0]
            received, _ = hvd.alltoall(sending, splits=[len(sending)] + [0] * (size - 1),
                                       name=f"{name}.gather.{index}.{source}",
                                       process_set=process_set)
            if rank == 0:
                placement.place(whole, received.numpy(), source, size)
        gathered.append(whole if rank == 0 else None)
    return gathered


def scatter(variables, values, name="hvdtrain.shards", process_set=hvd.global_process_set):
    """Sets each split variable among `variables` to its part of the whole
    value rank 0 of `process_set` holds. Call it on every rank of the set
    with the same variables in the same order.

    Args:
        variables: Keras variables; those not split are left alone.
        values: On the set's rank 0, the whole value of each of `variables`
            (arrays; entries for unsplit ones are not read); on its other
            ranks, not read (None will do).
        name: A prefix for the collectives' names.
        process_set: As for `gather`.
    """
    size, rank = process_set.size(), process_set.rank()
    for index, variable in enumerate(variables):
        placement = placement_of(variable)
        if placement is None:
            continue
        if size == 1:
            variable.assign(placement.part(np.asarray(values[index]), 0, 1))
            continue
        # Every worker's part has the shape of this one's (a table's shards
        # differ in rows only): the whole part goes to its worker as rows.
        empty = np.zeros((0, *variable.shape[1:]), variable.dtype)
        for target in range(size):
            splits = [0] * size
            if rank == 0:
                sending = np.ascontiguousarray(placement.part(
                    np.asarray(values[index]), target, size), variable.dtype)
                splits[target] = len(sending)
            else:
                sending = empty
            received, _ = hvd.alltoall(sending, splits=splits,
                                       name=f"{name}.scatter.{index}.{target}",
                                       process_set=process_set)
            if rank == target:
                variable.assign(received)


def replicated_copy(model):
    """`model` (a functional or Sequential model) with each layer whose
    weights are split across workers (a layer with a `plain_layer()`: the
    Keras layer it is, whole) replaced by that plain layer holding the whole
    weights, for serving without hvdtrain. Call it on every worker (the
    parts are gathered); the copy, uncompiled, exists on rank 0 only.

    Returns:
        The copy on rank 0, None on the other ranks; `model` itself if it
        has no such layer.
    """
    if not _has_plain_layers(model):
        return model
    weights = model.weights
    whole = gather(weights, weights, name="hvdtrain.export")
    if hvd.rank() != 0:
        return None
    return plain_copy(model, {weight.path: np.asarray(keras.ops.convert_to_numpy(value))
                              for weight, value in zip(weights, whole)})


def plain_copy(model, values):
    """`model` holding `values` ({weight path: whole value}), each layer
    with a `plain_layer()` replaced by that plain Keras layer in a copy;
    `model` itself, its weights set, if it has none."""
    if not _has_plain_layers(model):
        for weight in model.weights:
            weight.assign(values[weight.path])
        return model

    def clone(layer):
        if hasattr(layer, "plain_layer"):
            return layer.plain_layer()
        return layer.__class__.from_config(layer.get_config())

    copy = keras.models.clone_model(model, clone_function=clone)
    for layer in model.layers:   # cloned layers keep their names (the inputs' are new)
        if layer.weights:
            copy.get_layer(layer.name).set_weights([values[w.path] for w in layer.weights])
    return copy


def _has_plain_layers(model):
    return any(hasattr(layer, "plain_layer") for layer in model.layers)
