"""A Keras 3 optimizer whose updates use gradients reduced over all workers.

`DistributedOptimizer(keras.optimizers.Adam(...))` returns an optimizer of a
subclass of the given one's class, rebuilt from its config, whose `apply`
first reduces the gradients across processes (see reduction.py), then runs
the original update. It works inside `model.fit`'s compiled train step and in
custom loops that call `apply` or `apply_gradients`. The subclass keeps the
original class's name and module, so saved models load as the plain optimizer.

Mixed precision: a `keras.optimizers.LossScaleOptimizer` (given, or made here
when the global policy is mixed_float16, so that `compile()` does not wrap
the result again) is made distributed as a whole: gradients are reduced
*before* it checks them for inf/NaN, so every rank sees the same reduced
gradients and takes the same decision (apply, or skip and lower the scale).

Accumulation: with `backward_passes_per_step=N`, each process adds its
gradients to local accumulators (optimizer variables, so they are saved and
broadcast with the rest of its state) and reduces and applies them once
every N calls: N times less communication. With
`average_aggregated_gradients=True` the update equals one step on an N-times
larger batch; otherwise the N gradients are summed, as in Horovod. As in
Horovod (and Keras's own gradient_accumulation_steps), `iterations` counts
every call, so a LearningRateSchedule advances per batch.

Local variables (`register_local_var`, PartialDistributedOptimizer's
`local_layers`) keep each rank's own gradients; with scale_local_gradients
these are divided by the number of processes, as Horovod does.

Sharded embedding tables (hvdtrain.layers.ShardedEmbedding) are not
reduced: each worker's shard gets the gradients of its rows from every
worker by the layer's alltoall, averaged here like the rest, and applied to
the looked-up rows only (sparse_updates.py); weight decay leaves them alone.

Keras's own knobs act after the reduction, inside the update: clipping
(clipnorm, global_clipnorm, clipvalue) sees the averaged gradients, so every
rank clips alike and the update equals one process's on the global batch;
decoupled weight decay and the weights' moving average (use_ema) follow the
weights, which are the same everywhere.
"""

import functools

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain.errors import UsageError
from hvdtrain.parallel import split_variables
from hvdtrain.parallel.data_parallel.compression import Compression
from hvdtrain.parallel.data_parallel.reduction import GradientReducer, LocalVariables, chosen_groups
from hvdtrain.parallel.sharded_tables import sparse_updates

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "accumulated_only",
           "add_step_exchange", "check_loss_scale_order", "compile_updates", "configure",
           "is_distributed", "make_distributed", "rank_local_variables", "set_step_rate",
           "step_rate"]


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=hvd.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups="auto", process_set=hvd.global_process_set,
                         scale_local_gradients=True):
    """Makes a Keras 3 optimizer whose updates use gradients reduced over the processes.

    Horovod's `DistributedOptimizer`, with its arguments, for Keras 3
    optimizers. Wrap the optimizer before its first update: the result is a
    new instance made from `optimizer`'s config (see the module's docstring
    for mixed precision and accumulation).

    Args:
        optimizer: A `keras.optimizers.Optimizer` that has not been built
            yet. Under the mixed_float16 global policy, one that is not a
            `LossScaleOptimizer` is wrapped in one first.
        name: The new optimizer's name. None keeps `optimizer`'s (Horovod's
            default is "Distributed" and the class name).
        device_dense: Accepted for compatibility, no effect: hvdtrain keeps
            tensors where TensorFlow put them.
        device_sparse: Likewise.
        compression: `Compression.none`, `Compression.fp16` (float gradients
            sent as float16, as in Horovod) or `Compression.bf16`
            (hvdtrain's: bfloat16 payloads summed in float32, in one buffer
            per group; not with `op=hvd.Adasum`).
        sparse_as_dense: Convert sparse gradients (`tf.IndexedSlices`, from
            embeddings) to dense tensors and allreduce them with the others,
            instead of allgathering their rows and indices.
        gradient_predivide_factor: With `op=hvd.Average` only: gradients are
            scaled by `1 / gradient_predivide_factor` before the sum and by
            `gradient_predivide_factor / size` after it. Must be positive.
        op: `hvd.Average` (the default), `hvd.Sum` or `hvd.Adasum`. Adasum
            needs Horovod's MPI controller, the global process set and a
            power-of-2 number of processes (checked at the first update).
        backward_passes_per_step: Every process adds its gradients to local
            accumulators and the optimizer reduces and applies them once
            every this many calls. The accumulators are optimizer variables
            (saved and broadcast with its state), and `iterations` counts
            every call, as in Horovod.
        average_aggregated_gradients: With `backward_passes_per_step > 1`,
            divide the accumulated gradients by `backward_passes_per_step`
            (one step on a larger batch); False sums them, as in Horovod.
        num_groups: Horovod's older name for an integer `groups`, used when
            `groups` is "auto" or None; 0: none given.
        groups: "auto" (hvdtrain's default): None on GPUs and on CPU hosts
            with a core for Horovod's threads, 1 where the workers' threads
            fill the cores (`hvdtrain.runtime.gradients_overlap_backprop`).
            None (Horovod's default): each gradient has its own allreduce,
            started as soon as it is computed, and Horovod fuses those that
            meet in a cycle (with bf16 compression the dense ones form one
            buffer). A positive integer: that many groups of consecutive
            gradients, each reduced by one `hvd.grouped_allreduce`. A list of
            lists of variables: each list is reduced together, every other
            variable alone.
        process_set: The Horovod process set to reduce over. A rank outside
            it applies its own gradients, as in Horovod.
        scale_local_gradients: Divide the gradients of local variables (see
            `register_local_var`) by the process set's size, as Horovod
            does, so that they keep the scale of the averaged ones.

    Returns:
        An optimizer of a subclass of `optimizer`'s class that keeps its
        name and module (saved models load as the plain optimizer), with
        Horovod's `register_local_var(var)`. Sparse gradients have their
        duplicate rows summed before the update, so that they update the
        weights as the same gradient in dense form does.

    Raises:
        TypeError: If `optimizer` is not a `keras.optimizers.Optimizer`.
        UsageError: If `optimizer` is built, or an argument has a value
            or combination refused above. At the first update: if the
            train step runs under XLA (`jit_compile=True`), which Horovod's
            collectives do not support (`hvdtrain.jit_compile(model)`
            compiles the rest), or Adasum cannot run.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer wraps a keras.optimizers.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if optimizer.built:
        raise UsageError("DistributedOptimizer: wrap the optimizer before its first "
                         "update (it is rebuilt from its config)")
    if (not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and keras.mixed_precision.global_policy().name == "mixed_float16"):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    distributed = _distributed_class(type(optimizer)).from_config(optimizer.get_config())
    configure(distributed, GradientReducer(
        op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=chosen_groups(groups, num_groups),
        process_set=process_set, scale_local_gradients=scale_local_gradients),
        backward_passes_per_step, average_aggregated_gradients)
    if name:
        distributed.name = name
    return distributed


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",  # noqa: N802
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=hvd.Average, groups="auto",
                                process_set=hvd.global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """Makes a DistributedOptimizer some of whose layers keep each rank's gradients.

    Horovod's `PartialDistributedOptimizer`: the trainable weights of
    `local_layers` are registered with `register_local_var`, so their
    gradients are not reduced. Unlike `DistributedOptimizer`, it has no
    `backward_passes_per_step`, as in Horovod.

    Args:
        optimizer: As for `DistributedOptimizer`.
        name: As for `DistributedOptimizer`.
        device_dense: As for `DistributedOptimizer`.
        device_sparse: As for `DistributedOptimizer`.
        compression: As for `DistributedOptimizer`.
        sparse_as_dense: As for `DistributedOptimizer`.
        gradient_predivide_factor: As for `DistributedOptimizer`.
        op: As for `DistributedOptimizer`.
        groups: As for `DistributedOptimizer`.
        process_set: As for `DistributedOptimizer`.
        local_layers: A `keras.layers.Layer` or a list of them (None: none)
            whose gradients stay each rank's own. Build them first: their
            weights are registered here, and an unbuilt layer has none.
        scale_local_gradients: Divide those gradients by the process set's
            size, as Horovod does.

    Returns:
        The optimizer `DistributedOptimizer` returns, with the layers'
        weights registered as local.

    Raises:
        TypeError: As for `DistributedOptimizer`.
        UsageError: If `local_layers` holds something other than Keras
            layers, or as for `DistributedOptimizer`.
    """
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise UsageError("PartialDistributedOptimizer: local_layers must be keras layers")
    distributed = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for variable in layer.trainable_weights:
            distributed.register_local_var(variable)
    return distributed


def make_distributed(optimizer, reducer=None, backward_passes_per_step=1,
                     average_aggregated_gradients=False):
    """Makes an existing optimizer distributed in place, keeping its state.

    For optimizers that come out of a saved model (`hvdtrain.keras.load_model`),
    whose variables must not be rebuilt. The object's class becomes the
    distributed subclass `DistributedOptimizer` makes; an optimizer that is
    distributed already gets the new settings.

    Args:
        optimizer: A `keras.optimizers.Optimizer`, built or not.
        reducer: A `hvdtrain.parallel.data_parallel.reduction.GradientReducer` holding the reduction
            options (`DistributedOptimizer`'s `op`, `compression`, ...);
            None: its defaults (average over all processes).
        backward_passes_per_step: As for `DistributedOptimizer`; more than 1
            needs an optimizer that is not built yet, or was built with
            accumulators.
        average_aggregated_gradients: As for `DistributedOptimizer`.

    Returns:
        `optimizer` itself.

    Raises:
        UsageError: If `backward_passes_per_step` is not a positive integer,
            or is more than 1 for a built optimizer without accumulators.
    """
    if not is_distributed(optimizer):
        optimizer.__class__ = _distributed_class(type(optimizer))
    configure(optimizer, reducer or GradientReducer(), backward_passes_per_step,
              average_aggregated_gradients)
    return optimizer


def configure(optimizer, reducer, backward_passes_per_step, average_aggregated_gradients):
    """Sets a distributed optimizer's reduction and accumulation (see make_distributed)."""
    if not (isinstance(backward_passes_per_step, int) and backward_passes_per_step >= 1):
        raise UsageError("backward_passes_per_step must be a positive integer, "
                         f"got {backward_passes_per_step!r}")
    if optimizer.built and backward_passes_per_step > 1 and not optimizer._hvd_accumulators:
        raise UsageError("backward_passes_per_step > 1 needs an optimizer that has not "
                         "been built yet")
    optimizer._hvd_reducer = reducer
    if "_hvd_local" not in optimizer.__dict__:
        optimizer._hvd_local = LocalVariables()
    optimizer._hvd_passes = backward_passes_per_step
    optimizer._hvd_average_passes = average_aggregated_gradients


def is_distributed(optimizer):
    """Whether `optimizer` reduces its gradients (DistributedOptimizer or make_distributed)."""
    return isinstance(optimizer, _DistributedMixin)


def rank_local_variables(optimizer):
    """The optimizer variables whose values differ between ranks: gradients
    being accumulated before their reduction."""
    return list(getattr(optimizer, "_hvd_accumulators", ()))


def accumulated_only(optimizer):
    """Whether the optimizer's last call only added gradients to its
    accumulators (its `iterations` advanced, its weights did not)."""
    return (is_distributed(optimizer) and optimizer._hvd_passes > 1
            and int(optimizer._hvd_counter) != 0)


def add_step_exchange(optimizer, exchange):
    """Runs `exchange()` in each update of a distributed optimizer, with the
    gradients' reduction inside the train step (every `backward_passes_per_step`
    calls when accumulating), so that its collectives travel in the same
    Horovod cycle as theirs. Add it before the first step: the train step
    calls what is there when it is traced."""
    optimizer._hvd_exchanges = (*optimizer._hvd_exchanges, exchange)


def set_step_rate(optimizer, rate):
    """Has a distributed optimizer set its learning rate at each batch, in
    the train step, from `rate` (a `learning_rate_in_step.StepRate`). Set it
    before the first step: the train step calls it when traced."""
    optimizer._hvd_step_rate = rate


def step_rate(optimizer):
    """The StepRate `set_step_rate` gave `optimizer`, or None."""
    return getattr(optimizer, "_hvd_step_rate", None)


def compile_updates(optimizer):
    """Compiles a distributed optimizer's update with XLA, after the
    gradients' reduction (hvdtrain.run.xla); other optimizers are left as they
    are. Call it before the first step: the train step reads it when traced."""
    if is_distributed(optimizer):
        optimizer._hvd_xla_updates = True


def check_loss_scale_order(optimizer):
    """Refuses a plain LossScaleOptimizer around a distributed optimizer, which
    `compile()` makes when the mixed_float16 policy is set after wrapping: it
    would check each rank's own gradients, and ranks could decide differently."""
    if (isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and not is_distributed(optimizer) and is_distributed(optimizer.inner_optimizer)):
        raise UsageError("set the mixed_float16 policy before DistributedOptimizer(...): "
                         "compile() wrapped it in a LossScaleOptimizer that checks each "
                         "rank's own gradients")


class _DistributedMixin:
    """Comes before the optimizer's class in the distributed subclass."""

    _hvd_reducer = GradientReducer()
    _hvd_passes = 1
    _hvd_average_passes = False
    _hvd_accumulators = ()
    _hvd_local = LocalVariables()
    _hvd_exchanges = ()
    _hvd_xla_updates = False
    _hvd_step_rate = None
    _hvd_momentum_ratio = None   # of the batch being traced, with a step rate

    def register_local_var(self, var):
        """Keeps `var`'s gradient on each rank (Horovod's per-rank variables).
        Register before the first step: the train step reads these when traced."""
        self._hvd_local.add(var)

    def add_variable_from_reference(self, reference_variable, *args, **kwargs):
        # A slot (or accumulator, or moving average) of a part of a
        # tensor-parallel weight is that part of the whole weight's slot:
        # checkpoints gather and reshard it with the weight.
        variable = super().add_variable_from_reference(reference_variable, *args, **kwargs)
        placement = split_variables.placement_of(reference_variable)
        if (isinstance(placement, split_variables.TensorSplit)
                and tuple(variable.shape) == tuple(reference_variable.shape)):
            split_variables.mark(variable, placement)
        return variable

    def build(self, variables):
        variables = list(variables)
        shards = [v for v in variables if split_variables.is_rows_sharded(v)]
        if shards:
            sparse_updates.check(self, self._hvd_passes > 1)
            variables = [v for v in variables if not split_variables.is_rows_sharded(v)]
        super().build(variables)
        # Positions, not the variables: Keras tracks variables kept on an
        # optimizer as its own state (they would be saved with it).
        self._hvd_positions = {id(v): i for i, v in enumerate(variables)}
        self._hvd_shard_slots = {}
        for shard in shards:
            first = len(self.variables)
            sparse_updates.make_slots(self, shard)
            self._hvd_shard_slots[id(shard)] = range(first, len(self.variables))
        if self._hvd_passes > 1:
            self._hvd_counter = self.add_variable((), dtype="int64", name="hvd_passes")
            self._hvd_accumulators = [
                self.add_variable_from_reference(v, name="hvd_accumulated") for v in variables]
        _start_moving_averages(self, variables)

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            # Outside any branch below: variables cannot be created in a tf.cond.
            with tf.name_scope(self.name):
                self.build(trainable_variables)
            self.built = True
        _refuse_xla()
        self._hvd_reducer.check_runtime()
        variables = list(trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
        grads = list(grads)
        if self._hvd_step_rate is not None:
            # Every batch, also one that only accumulates: the rate is the batch's.
            self._hvd_momentum_ratio = self._hvd_step_rate.set(self)
        if any(split_variables.is_rows_sharded(v) for v in variables):
            return self._apply_with_shards(grads, variables)
        if self._hvd_passes == 1:
            self._exchange_with_the_gradients()
            reduced = self._hvd_reducer(grads, variables, self._hvd_local)
            return self._update(_summed_duplicates(reduced), trainable_variables)
        return self._accumulate_then_apply(grads, variables, trainable_variables)

    def _apply_with_shards(self, grads, variables):
        """Reduces and applies the replicated variables' gradients; applies
        each shard's own, averaged, to its looked-up rows."""
        replicated = [(g, v) for g, v in zip(grads, variables)
                      if not split_variables.is_rows_sharded(v)]
        self._exchange_with_the_gradients()
        reduced = self._hvd_reducer([g for g, _ in replicated], [v for _, v in replicated],
                                    self._hvd_local)
        average = 1.0 / self._hvd_reducer.size() if (
            self._hvd_reducer.op == hvd.Average) else 1.0
        for grad, variable in zip(grads, variables):
            if grad is not None and split_variables.is_rows_sharded(variable):
                (grad,) = _summed_duplicates([grad])
                sparse_updates.update(
                    self, tf.IndexedSlices(grad.values * average, grad.indices), variable,
                    [self.variables[i] for i in self._hvd_shard_slots[id(variable)]])
        if not replicated:   # Keras counts the step only when it updates something
            self.iterations.assign_add(1)
            return None
        return self._update(_summed_duplicates(reduced), [v for _, v in replicated])

    def _update(self, grads, trainable_variables):
        """The optimizer's own update with reduced `grads`; compiled with XLA
        when asked (compile_updates) and every gradient has a static shape."""
        apply = super().apply

        def update():
            if self._hvd_xla_updates and all(g is None or isinstance(g, tf.Tensor)
                                             for g in grads):
                return tf.function(lambda grads: apply(grads, trainable_variables),
                                   jit_compile=True)(grads)
            return apply(grads, trainable_variables)

        if self._hvd_step_rate is None:
            return update()
        return self._hvd_step_rate.corrected(self, self._hvd_momentum_ratio, update)

    def _exchange_with_the_gradients(self):
        for exchange in self._hvd_exchanges:
            exchange()

    def _accumulate_then_apply(self, grads, variables, trainable_variables):
        positions = (range(len(grads)) if variables is None
                     else [self._hvd_positions[id(v)] for v in variables])
        accumulators = [self._hvd_accumulators[i] for i in positions]
        for accumulator, grad in zip(accumulators, grads):
            if grad is not None:
                accumulator.assign_add(tf.convert_to_tensor(grad))
        self._hvd_counter.assign_add(1)

        def reduce_and_apply():
            self._exchange_with_the_gradients()
            scale = 1.0 / self._hvd_passes if self._hvd_average_passes else 1.0
            summed = [None if g is None else a.value * scale
                      for a, g in zip(accumulators, grads)]
            self._update(self._hvd_reducer(summed, variables, self._hvd_local),
                         trainable_variables)
            for accumulator in accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            self._hvd_counter.assign(0)

        def count_the_call():
            # Horovod counts every call; the applying one counts in `apply`.
            self.iterations.assign_add(1)

        # The counter is the same on every rank, so all take the same branch
        # and the collectives inside stay paired.
        tf.cond(self._hvd_counter >= self._hvd_passes, reduce_and_apply, count_the_call)


def _summed_duplicates(grads):
    """`grads` with each tf.IndexedSlices holding every row once, its values
    summed. Keras 3's optimizers square a sparse gradient's values before
    duplicate rows are added up (Adam's second moment), so a word seen twice
    in a batch, or allgathered from several workers, would get a sum of
    squares instead of the square of the sum: a different update than the
    same gradient as a dense tensor (--sparse_as_dense) gets."""
    summed = []
    for grad in grads:
        if isinstance(grad, tf.IndexedSlices):
            rows, positions = tf.unique(grad.indices)
            grad = tf.IndexedSlices(
                tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(rows)[0]),
                rows, grad.dense_shape)
        summed.append(grad)
    return summed


def _start_moving_averages(optimizer, variables):
    """Starts the weights' moving averages (use_ema) at the weights.

    Keras starts them at zero and takes the weights themselves at the first
    update, which it recognises by `iterations == 0`. Accumulating, the first
    update comes later (`iterations` counts every batch, as in Horovod), and
    the averages would start at zero and take hundreds of steps to forget
    it. Started at the weights they are right from the first update on."""
    holder = getattr(optimizer, "inner_optimizer", optimizer)   # a LossScaleOptimizer's
    if not getattr(holder, "use_ema", False):
        return
    with tf.init_scope():   # once, also when built while the train step is traced
        for variable, average in zip(variables, holder._model_variables_moving_average):
            if average is not None:
                average.assign(variable)


def _refuse_xla():
    """Horovod 0.28.1 has no XLA kernels for its collectives on CPU (and on
    GPU only for a plain allreduce behind HOROVOD_ENABLE_XLA_OPS), so a
    jit-compiled train step cannot contain them."""
    from tensorflow.python.ops import control_flow_util  # no public equivalent
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise UsageError("DistributedOptimizer cannot run inside XLA (Horovod's collectives "
                         "have no XLA kernels): compile the model with jit_compile=False, then "
                         "hvdtrain.jit_compile(model) compiles the rest of the train step "
                         "(hvdtrain train: --jit_compile)")


@functools.cache
def _distributed_class(cls):
    return type(cls.__name__, (_DistributedMixin, cls),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
