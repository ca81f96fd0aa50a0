"""Which part of the work each Horovod process does: the process layout.

N workers with tensor parallelism T form D = N / T data-parallel replicas of
T consecutive ranks each (tensor parallelism inside a host, where the links
are fastest; Megatron-LM's layout):

    rank r: replica r // T (its data-parallel rank), tensor-parallel rank r % T
    tensor-parallel group of r: the T ranks of its replica
    data-parallel group of r:   the D ranks of the same tensor-parallel rank

The ranks of a replica read the same batch and hold the parts of its split
layers (hvdtrain.parallel.tensor); gradients are reduced over the
data-parallel group. Everything counted per replica (the data's shards, the
learning rate's scaling, the position of a checkpoint) counts D, not N;
without tensor parallelism D = N and the replica is the worker.

The groups are Horovod process sets, made by `arrange` on every rank in the
same order (Horovod's rule), once per process: a later run in the same
process (tests, a notebook) uses those it made.
"""

import dataclasses

import horovod.tensorflow as hvd

from hvdtrain.errors import UsageError

__all__ = ["Layout", "arrange", "current", "data_rank", "data_set", "data_size", "tensor_rank",
           "tensor_set", "tensor_size"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """N = `size` workers in replicas of `tensor` consecutive ranks."""
    size: int
    tensor: int = 1

    @property
    def replicas(self):
        return self.size // self.tensor

    def tensor_group(self, rank):
        """The ranks of `rank`'s replica, in order."""
        first = rank - rank % self.tensor
        return list(range(first, first + self.tensor))

    def data_group(self, rank):
        """The ranks of `rank`'s tensor-parallel rank, one per replica."""
        return list(range(rank % self.tensor, self.size, self.tensor))

    def groups(self):
        """Every group that needs a process set, in the order every rank makes them:
        those of more than one rank and fewer than all."""
        tensor = [self.tensor_group(first) for first in range(0, self.size, self.tensor)]
        data = [self.data_group(position) for position in range(self.tensor)]
        return [group for group in tensor + data if 1 < len(group) < self.size]


_layout = None
_sets = {}   # (ranks) -> hvd.ProcessSet, for the groups of this rank


def arrange(tensor_parallel=1):
    """Makes the layout of `tensor_parallel` consecutive ranks per replica.

    Call it on every rank, after hvd.init: with tensor_parallel > 1, Horovod
    must have started with dynamic process sets (`hvdtrain.init` does that).

    Raises:
        UsageError: If the number of workers is not a multiple of
            `tensor_parallel`, or Horovod cannot add process sets.
    """
    global _layout
    size = hvd.size()
    if not (isinstance(tensor_parallel, int) and tensor_parallel >= 1):
        raise UsageError(f"tensor_parallel must be a positive integer, got {tensor_parallel!r}")
    if size % tensor_parallel:
        raise UsageError(f"--tensor_parallel={tensor_parallel} does not divide the {size} "
                         f"workers into replicas; start a multiple of {tensor_parallel} "
                         "processes (horovodrun -np) or choose a divisor of "
                         f"{size}")
    layout = Layout(size, tensor_parallel)
    for group in layout.groups():
        key = tuple(group)
        if key in _sets:
            continue
        try:
            _sets[key] = hvd.add_process_set(group)
        except (AssertionError, ValueError, RuntimeError) as e:
            raise UsageError(f"Horovod could not make the process set of ranks {group} ({e}); "
                             "start it with hvdtrain.init(tensor_parallel=...) or "
                             "HOROVOD_DYNAMIC_PROCESS_SETS=1") from None
    _layout = layout


def current():
    """The Layout this process trains with (without `arrange`: every worker
    its own replica)."""
    if _layout is None or _layout.size != hvd.size():
        return Layout(hvd.size())
    return _layout


def data_size():
    """D: the data-parallel replicas (the workers, without tensor parallelism)."""
    return current().replicas


def data_rank():
    """This worker's replica: the shard of the data it reads."""
    return hvd.rank() // current().tensor


def tensor_size():
    """T: the ranks of a replica, which split its layers."""
    return current().tensor


def tensor_rank():
    """This worker's part of its replica's split layers."""
    return hvd.rank() % current().tensor


def data_set():
    """The process set over which this worker's gradients are reduced."""
    return _set_of(current().data_group(hvd.rank()))


def tensor_set():
    """The process set of this worker's replica, for its split layers' collectives."""
    return _set_of(current().tensor_group(hvd.rank()))


def _set_of(group):
    if len(group) == hvd.size():
        return hvd.global_process_set
    if len(group) == 1:
        return _ALONE
    return _sets[tuple(group)]


class _Alone:
    """A group of this worker alone: nothing to exchange, so no Horovod set.
    Answers what code asks of a process set before it skips a collective."""

    def size(self):
        return 1

    def rank(self):
        return 0

    def included(self):
        return True


_ALONE = _Alone()
