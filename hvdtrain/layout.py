"""Which part of the work each Horovod process does: the process layout.

N workers with tensor parallelism T and pipeline parallelism P form
D = N / (T x P) data-parallel replicas. Tensor parallelism is innermost (T
consecutive ranks, inside a host, where the links are fastest), pipeline
parallelism outermost (stages across hosts, which only pass activations to
their neighbours): Megatron-LM's layout.

    rank r = t + T * (d + D * p):
        tensor-parallel rank t = r % T, data-parallel rank d = r // T % D,
        pipeline stage p = r // (T * D)
    tensor-parallel group of r:  the T ranks of its replica's stage, same d and p
    data-parallel group of r:    the D ranks of the same t and p, one per replica
    pipeline group of r:         the P ranks of the same t and d, one per stage
    stage group of r:            the D x T ranks of the same p

The ranks of a replica read the same batch; those of a stage hold the parts
of its split layers (hvdtrain.parallel.tensor_parallel); the stages pass activations
forward and their gradients back between neighbours
(hvdtrain.parallel.pipeline_parallel); gradients are reduced over the data-parallel
group. Everything counted per replica (the data's shards, the learning
rate's scaling, the position of a checkpoint) counts D, not N; without
tensor or pipeline parallelism D = N and the replica is the worker.

The groups, and each pair of neighbouring stages, are Horovod process sets,
made by `arrange` on every rank in the same order (Horovod's rule), once per
process: a later run in the same process (tests, a notebook) uses those it
made.
"""

import dataclasses

import horovod.tensorflow as hvd

from hvdtrain.errors import UsageError

__all__ = ["Layout", "arrange", "current", "data_rank", "data_set", "data_size",
           "neighbour_set", "pipeline_rank", "pipeline_set", "pipeline_size", "stage_leaders",
           "stage_set", "tensor_rank", "tensor_set", "tensor_size"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """N = `size` workers in replicas of `pipeline` stages of `tensor`
    consecutive ranks."""
    size: int
    tensor: int = 1
    pipeline: int = 1

    @property
    def replicas(self):
        return self.size // (self.tensor * self.pipeline)

    def position(self, rank):
        """(tensor rank, data rank, stage) of `rank`."""
        return (rank % self.tensor, rank // self.tensor % self.replicas,
                rank // (self.tensor * self.replicas))

    def rank_at(self, tensor, data, stage):
        return tensor + self.tensor * (data + self.replicas * stage)

    def tensor_group(self, rank):
        """The ranks of `rank`'s replica's stage, in order."""
        _, data, stage = self.position(rank)
        return [self.rank_at(t, data, stage) for t in range(self.tensor)]

    def data_group(self, rank):
        """The ranks of `rank`'s tensor-parallel rank and stage, one per replica."""
        tensor, _, stage = self.position(rank)
        return [self.rank_at(tensor, d, stage) for d in range(self.replicas)]

    def pipeline_group(self, rank):
        """The ranks that hold `rank`'s part of each stage of its replica, by stage."""
        tensor, data, _ = self.position(rank)
        return [self.rank_at(tensor, data, p) for p in range(self.pipeline)]

    def stage_group(self, rank):
        """Every rank of `rank`'s stage, of every replica, in order; its
        first, the stage's rank in replica 0, is the stage's leader."""
        _, _, stage = self.position(rank)
        return [self.rank_at(t, d, stage) for d in range(self.replicas)
                for t in range(self.tensor)]

    def groups(self):
        """Every group that needs a process set, in the order every rank makes
        them: those of more than one rank and fewer than all, each once (a
        pipeline of two stages is its own pair of neighbours)."""
        everyone = range(self.size)
        pipelines = {tuple(self.pipeline_group(r)) for r in everyone}
        candidates = ({tuple(self.tensor_group(r)) for r in everyone}
                      | {tuple(self.data_group(r)) for r in everyone}
                      | pipelines
                      | {tuple(self.stage_group(r)) for r in everyone}
                      | {pipeline[p:p + 2] for pipeline in pipelines
                         for p in range(self.pipeline - 1)})
        return [list(group) for group in sorted(candidates, key=lambda g: (len(g), g))
                if 1 < len(group) < self.size]


_layout = None
_sets = {}   # (ranks) -> hvd.ProcessSet, for the groups of this rank


def arrange(tensor_parallel=1, pipeline_parallel=1):
    """Makes the layout of replicas of `pipeline_parallel` stages of
    `tensor_parallel` consecutive ranks.

    Call it on every rank, after hvd.init: with more than one rank per
    replica, Horovod must have started with dynamic process sets
    (`hvdtrain.init` does that).

    Raises:
        UsageError: If the number of workers is not a multiple of
            tensor_parallel x pipeline_parallel, or Horovod cannot add
            process sets.
    """
    global _layout
    size = hvd.size()
    for name, value in (("tensor_parallel", tensor_parallel),
                        ("pipeline_parallel", pipeline_parallel)):
        if not (isinstance(value, int) and value >= 1):
            raise UsageError(f"{name} must be a positive integer, got {value!r}")
    per_replica = tensor_parallel * pipeline_parallel
    if size % per_replica:
        flags = " x ".join(f"--{name}={value}" for name, value in
                           (("tensor_parallel", tensor_parallel),
                            ("pipeline_parallel", pipeline_parallel)) if value > 1)
        raise UsageError(f"{flags} does not divide the {size} workers into replicas; start "
                         f"a multiple of {per_replica} processes (horovodrun -np) or choose "
                         f"sizes whose product divides {size}")
    layout = Layout(size, tensor_parallel, pipeline_parallel)
    for group in layout.groups():
        key = tuple(group)
        if key in _sets:
            continue
        try:
            _sets[key] = hvd.add_process_set(group)
        except (AssertionError, ValueError, RuntimeError) as e:
            raise UsageError(f"Horovod could not make the process set of ranks {group} ({e}); "
                             "start it with hvdtrain.init(tensor_parallel=..., "
                             "pipeline_parallel=...) or HOROVOD_DYNAMIC_PROCESS_SETS=1") from None
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
    return current().position(hvd.rank())[1]


def tensor_size():
    """T: the ranks of a replica, which split its layers."""
    return current().tensor


def tensor_rank():
    """This worker's part of its replica's split layers."""
    return current().position(hvd.rank())[0]


def pipeline_size():
    """P: the stages of a replica's model."""
    return current().pipeline


def pipeline_rank():
    """The stage of the model this worker runs."""
    return current().position(hvd.rank())[2]


def data_set():
    """The process set over which this worker's gradients are reduced."""
    return _set_of(current().data_group(hvd.rank()))


def tensor_set():
    """The process set of this worker's replica, for its split layers' collectives."""
    return _set_of(current().tensor_group(hvd.rank()))


def pipeline_set():
    """The process set of this worker's stages of its replica (one rank per stage)."""
    return _set_of(current().pipeline_group(hvd.rank()))


def stage_set():
    """The process set of every rank of this worker's stage (all of them
    without a pipeline)."""
    return _set_of(current().stage_group(hvd.rank()))


def stage_leaders():
    """The ranks that lead each stage (replica 0's, tensor-parallel rank 0),
    by stage: rank 0's pipeline group."""
    return current().pipeline_group(0)


def neighbour_set(offset):
    """The process set of this worker and its counterpart `offset` (+1 or -1)
    stages on: the pair that passes activations and gradients between them."""
    group = current().pipeline_group(hvd.rank())
    stage = pipeline_rank()
    return _set_of(sorted([group[stage], group[stage + offset]]))


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
