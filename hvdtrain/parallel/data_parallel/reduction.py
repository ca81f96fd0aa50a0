"""Reducing a list of gradients across Horovod processes, with Horovod's
options; shared by DistributedOptimizer and DistributedGradientTape.

Dense gradients of an explicit group go through one `hvd.grouped_allreduce`
(negotiated together, fused into few ring-allreduces); without groups each
has its own allreduce, and Horovod fuses those ready in the same cycle. Sparse
gradients (tf.IndexedSlices, from embeddings) are allgathered, as Horovod
does, unless `sparse_as_dense` turns them into dense tensors first.

Horovod pairs the ranks' collectives by name. Left unnamed, each would be
named after its gradient tensor, whose name holds layer names, and those
differ between ranks whose models got other auto-generated names (a layer
made first on one rank, a model loaded from a file on rank 0 only): every
rank would wait forever. So each collective is named by what every rank
shares: the reducer's place among the reducers this process traced, and the
gradient's position (Horovod's `use_generic_names`). A retrace keeps the
reducer's number; two optimizers in one step get two.
"""

import dataclasses
import itertools

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import runtime
from hvdtrain.errors import UsageError
from hvdtrain.parallel.collectives import root_name_scope
from hvdtrain.parallel.data_parallel.compression import BF16Compressor, Compression

__all__ = ["GradientReducer", "LocalVariables", "OPS", "chosen_groups"]

OPS = {"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}

# Numbers the reducers in the order this process first traces them: the
# same on every rank, as every rank runs the same steps.
_TRACED_REDUCERS = itertools.count()


class LocalVariables:
    """Variables whose gradients stay on each rank (Horovod's
    `register_local_var`). A plain holder: Keras would track a list of
    variables kept on an optimizer as its own state."""

    def __init__(self, variables=()):
        self._variables = {}
        for variable in variables:
            self.add(variable)

    def add(self, variable):
        self._variables[id(variable)] = variable

    def __contains__(self, variable):
        return id(variable) in self._variables

    def __len__(self):
        return len(self._variables)

    def __iter__(self):
        return iter(self._variables.values())


def chosen_groups(groups, num_groups):
    """The groups Horovod's `groups` and older `num_groups` arguments ask
    for: num_groups where groups is left to its default or None."""
    return num_groups if num_groups and groups in (None, "auto") else groups


@dataclasses.dataclass(frozen=True)
class GradientReducer:
    """Horovod's gradient-reduction options, with their documented meaning.

    op: hvd.Average, hvd.Sum or hvd.Adasum (Adasum needs the MPI controller).
    compression: Compression.none, .fp16 or .bf16.
    sparse_as_dense: reduce IndexedSlices densely instead of allgathering them.
    gradient_predivide_factor: with Average, scale by 1/f before the sum and
      f/size after it (keeps fp16 sums of many ranks in range).
    groups: "auto" (1 where the workers' threads fill the host's cores,
      else None: `runtime.gradients_overlap_backprop`), None (no explicit
      groups: Horovod fuses dynamically), a number of groups of consecutive
      gradients, or lists of variables reduced together (every other
      variable then forms a group of its own).
    process_set: the processes to reduce over; a rank outside it keeps its
      own gradients, as in Horovod.
    scale_local_gradients: divide the gradients of local variables (see
      __call__) by the process set's size, as Horovod does, so that they
      keep the scale of the averaged ones.
    """
    op: object = hvd.Average
    compression: type = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    groups: object = "auto"
    process_set: object = hvd.global_process_set
    scale_local_gradients: bool = True

    def __post_init__(self):
        if self.op not in OPS.values():
            raise UsageError(f"op must be hvd.Average, hvd.Sum or hvd.Adasum, got {self.op!r}")
        if self.gradient_predivide_factor != 1.0 and self.op != hvd.Average:
            raise UsageError("gradient_predivide_factor needs op=hvd.Average")
        if self.gradient_predivide_factor <= 0:
            raise UsageError("gradient_predivide_factor must be positive")
        if self.compression is BF16Compressor and self.op == hvd.Adasum:
            raise UsageError("bf16 compression supports op=hvd.Average and hvd.Sum, not Adasum")
        if self.groups not in (None, "auto") and not isinstance(self.groups, list) and not (
                isinstance(self.groups, int) and self.groups > 0):
            raise UsageError("groups must be 'auto', None, a positive number or a list of "
                             "lists of variables")

    def check_runtime(self):
        """Checks what depends on how Horovod was started (after hvd.init)."""
        if self.op != hvd.Adasum or self.size() == 1:
            return
        if not hvd.mpi_enabled():
            raise UsageError("op=hvd.Adasum needs Horovod's MPI controller "
                             "(horovodrun --mpi); use hvd.Average with Gloo")
        if self.process_set != hvd.global_process_set or self.size() & (self.size() - 1):
            raise UsageError("op=hvd.Adasum needs the global process set and a power-of-2 "
                             "number of processes")

    def size(self):
        return self.process_set.size()

    def __call__(self, grads, variables=None, local=()):
        """Returns `grads` reduced across the process set (None stays None);
        the gradients of the variables in `local` stay this rank's own."""
        grads = list(grads)
        if local and variables is None:
            raise UsageError("local variables need the variables with the gradients")
        kept = {i for i, v in enumerate(variables or ()) if v in local}
        reduced = list(grads)
        shared = [i for i, g in enumerate(grads) if g is not None and i not in kept]
        if shared and self.process_set.included() and self.size() > 1:
            if self.sparse_as_dense:
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in grads]
            prefix = "hvdtrain.reducer" if tf.executing_eagerly() else self._traced_name()
            with root_name_scope():
                for group in self._split(shared, variables):
                    name = f"{prefix}.grads{group[0]}"
                    for i, g in zip(group, self._reduce_group([grads[i] for i in group],
                                                              group, name)):
                        reduced[i] = g
        if kept and self.scale_local_gradients:
            for i in kept:
                reduced[i] = _divided(grads[i], self.size())
        return reduced

    def _traced_name(self):
        # Horovod ignores the names of eager collectives: only traced
        # reducers are numbered (a worker that joins an elastic job counts
        # as the others do, whatever they ran eagerly before).
        if "_traced_number" not in self.__dict__:
            object.__setattr__(self, "_traced_number", next(_TRACED_REDUCERS))
        return f"hvdtrain.reducer{self._traced_number}"

    def _split(self, indices, variables):
        groups = self.groups
        if groups == "auto":
            groups = None if runtime.gradients_overlap_backprop() else 1
        if groups is None:
            if self.compression is BF16Compressor:
                return [indices] if indices else []  # one flat 16-bit buffer
            # Horovod's default: no explicit groups. Each gradient's allreduce
            # can start as soon as that gradient exists, overlapping the rest
            # of the backward pass, and Horovod fuses those that meet in a cycle.
            return [[i] for i in indices]
        if isinstance(groups, int):
            count = min(groups, len(indices))
            return [indices[k * len(indices) // count:(k + 1) * len(indices) // count]
                    for k in range(count)]
        if variables is None:
            raise UsageError("groups given as lists of variables need the variables "
                             "with the gradients")
        position = {id(v): i for i, v in enumerate(variables)}
        grouped = [[position[id(v)] for v in group if position.get(id(v)) in indices]
                   for group in self.groups]
        taken = {i for group in grouped for i in group}
        return [g for g in grouped if g] + [[i] for i in indices if i not in taken]

    def _reduce_group(self, tensors, positions, name):
        sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
        out = [None] * len(tensors)
        for i in sparse:
            out[i] = self._allgather_sparse(tensors[i], f"{name}.sparse{positions[i]}")
        if dense:
            for i, t in zip(dense, self._reduce_dense([tensors[i] for i in dense], name)):
                out[i] = t
        return out

    def _allgather_sparse(self, grad, name):
        # Horovod's rule: values and indices allgathered, values divided by
        # size for Average; pre/post-scaling does not apply to them. Done
        # here because Horovod's own leaves these allgathers unnamed.
        values = hvd.allgather(grad.values, name=f"{name}.values", ignore_name_scope=True,
                               process_set=self.process_set)
        indices = hvd.allgather(grad.indices, name=f"{name}.indices", ignore_name_scope=True,
                                process_set=self.process_set)
        if self.op != hvd.Sum:
            values = values / tf.cast(self.size(), values.dtype)
        return tf.IndexedSlices(values, indices, grad.dense_shape)

    def _reduce_dense(self, tensors, name):
        if self.compression is BF16Compressor:
            return _bf16_allreduce(tensors, self.op == hvd.Average, self.process_set,
                                   name=f"{name}.bf16")
        if self.op == hvd.Adasum:
            # One allreduce per tensor: Horovod 0.28.1's grouped_allreduce
            # fails on Adasum (a Python scoping bug); Horovod still fuses these.
            return [hvd.allreduce(t, op=hvd.Adasum, compression=self.compression,
                                  name=f"{name}.{k}", ignore_name_scope=True,
                                  process_set=self.process_set) for k, t in enumerate(tensors)]
        op, prescale, postscale = self.op, 1.0, 1.0
        if self.gradient_predivide_factor != 1.0:
            op = hvd.Sum
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor / self.size()
        # Cond branches are inlined under names of the enclosing graph:
        # ignore_name_scope keeps only this name.
        return hvd.grouped_allreduce(tensors, op=op, compression=self.compression,
                                     prescale_factor=prescale, postscale_factor=postscale,
                                     name=name, ignore_name_scope=True,
                                     process_set=self.process_set)


def _divided(grad, divisor):
    if grad is None:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / divisor, grad.indices, grad.dense_shape)
    return grad / divisor


def _bf16_allreduce(tensors, average, process_set, name):
    """Sum (or average) of float tensors sent as bfloat16, summed in float32.

    The group is flattened into one buffer and reduced like a ring allreduce,
    in two phases of the same volume: an alltoall hands each rank one slice
    of every rank's buffer (a reduce-scatter, summed locally in float32),
    then an allgather shares the reduced slices. Horovod moves the 16-bit
    payloads as uint16 bits, since it cannot add bfloat16 itself.
    """
    size = process_set.size()
    dtypes = [t.dtype for t in tensors]
    shapes = [tf.shape(t) for t in tensors]
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], axis=0)
    length = tf.shape(flat)[0]
    padded = -(-length // size) * size
    flat = tf.pad(flat, [[0, padded - length]])
    slices = tf.reshape(_to_bits(flat), [size, -1])
    received = hvd.alltoall(slices, name=f"{name}.scatter", ignore_name_scope=True,
                            process_set=process_set)
    mine = tf.reduce_sum(_from_bits(received), axis=0)
    if average:
        mine = mine / size
    gathered = hvd.allgather(_to_bits(mine), name=f"{name}.gather", ignore_name_scope=True,
                             process_set=process_set)
    total = _from_bits(gathered)[:length]
    sizes = [tf.reduce_prod(s) for s in shapes]
    return [tf.cast(tf.reshape(part, shape), dtype)
            for part, shape, dtype in zip(tf.split(total, tf.stack(sizes)), shapes, dtypes)]


def _to_bits(values):
    return tf.bitcast(tf.cast(values, tf.bfloat16), tf.uint16)


def _from_bits(bits):
    return tf.cast(tf.bitcast(bits, tf.bfloat16), tf.float32)
