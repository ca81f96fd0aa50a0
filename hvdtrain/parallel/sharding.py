"""Variables split across workers by rows: where each row lives, and the
whole table out of its shards and back.

A sharded variable (an embedding table of hvdtrain.layers.ShardedEmbedding
and the optimizer's slots for it) holds on each worker only the rows its
`Placement` gives that worker, in increasing row order. Everything that
treats the state as one thing (checkpoints, export) sees the whole table in
row order, which does not depend on the number of workers: a checkpoint
written by N workers resumes on M.

Rank 0 writes checkpoints and exports, and their directory need not be
shared between hosts, so `gather` brings the whole table to rank 0, one
worker's shard at a time, and `scatter` sends each worker its rows back.
Rank 0 thus holds one table in host memory while it saves, never all
workers' device memory.
"""

import dataclasses

import horovod.tensorflow as hvd
import keras
import numpy as np

__all__ = ["NO_XLA", "Placement", "gather", "has_shards", "is_sharded", "logical_shape", "mark",
           "placement_of", "scatter"]

# Why a model with sharded variables is not compiled with XLA.
NO_XLA = ("tables sharded across workers (ShardedEmbedding) exchange rows inside the forward "
          "pass, which XLA cannot hold (Horovod's collectives have no XLA kernels); leave "
          "--jit_compile off")

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


def mark(variable, placement):
    """Records that `variable` holds this worker's shard of a table placed so."""
    setattr(variable, _ATTRIBUTE, placement)
    return variable


def placement_of(variable):
    """The variable's Placement, or None for a variable every worker holds whole."""
    return getattr(variable, _ATTRIBUTE, None)


def is_sharded(variable):
    return placement_of(variable) is not None


def has_shards(model):
    """Whether any of `model`'s variables is a shard."""
    return any(is_sharded(v) for v in model.variables)


def logical_shape(variable):
    """The shape of the whole variable: the table's, for a shard."""
    placement = placement_of(variable)
    shape = tuple(variable.shape)
    return shape if placement is None else (placement.rows, *shape[1:])


def gather(variables, values, name="hvdtrain.shards"):
    """The whole tables of the sharded ones among `variables`, on rank 0.

    Call it on every rank with the same variables in the same order.

    Args:
        variables: Keras variables, sharded or not.
        values: Their values to use (tensors or arrays), in the same order.
        name: A prefix for the collectives' names.

    Returns:
        `values` with each shard replaced by the whole table (a NumPy array
        in row order) on rank 0; on other ranks, shards become None.
    """
    size, rank = hvd.size(), hvd.rank()
    gathered = []
    for index, (variable, value) in enumerate(zip(variables, values)):
        placement = placement_of(variable)
        if placement is None:
            gathered.append(value)
            continue
        shard = np.asarray(keras.ops.convert_to_numpy(value))
        if size == 1:
            gathered.append(shard)
            continue
        table = (np.empty((placement.rows, *shard.shape[1:]), shard.dtype) if rank == 0
                 else None)
        if rank == 0:
            table[placement.owned_rows(0, size)] = shard
        for source in range(1, size):
            # Only `source` sends, and only to rank 0: one shard in flight.
            sending = shard if rank == source else shard[:0]
            received, _ = hvd.alltoall(sending, splits=[len(sending)] + [0] * (size - 1),
                                       name=f"{name}.gather.{index}.{source}")
            if rank == 0:
                table[placement.owned_rows(source, size)] = received.numpy()
        gathered.append(table)
    return gathered


def scatter(variables, tables, name="hvdtrain.shards"):
    """Sets each sharded variable among `variables` to its rows of the whole
    table rank 0 holds. Call it on every rank with the same variables in the
    same order.

    Args:
        variables: Keras variables; those not sharded are left alone.
        tables: On rank 0, the whole value of each of `variables` (arrays in
            row order; entries for unsharded ones are not read); on other
            ranks, not read (None will do).
        name: A prefix for the collectives' names.
    """
    size, rank = hvd.size(), hvd.rank()
    for index, variable in enumerate(variables):
        placement = placement_of(variable)
        if placement is None:
            continue
        if size == 1:
            variable.assign(tables[index])
            continue
        empty = np.zeros((0, *variable.shape[1:]), variable.dtype)
        for target in range(size):
            splits = [0] * size
            if rank == 0:
                sending = np.asarray(tables[index][placement.owned_rows(target, size)],
                                     variable.dtype)
                splits[target] = len(sending)
            else:
                sending = empty
            received, _ = hvd.alltoall(sending, splits=splits,
                                       name=f"{name}.scatter.{index}.{target}")
            if rank == target:
                variable.assign(received)
