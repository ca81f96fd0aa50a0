"""A Keras model whose stages run on the ranks of a pipeline, fed with
micro-batches.

Each rank holds one stage (hvdtrain.layout.pipeline_rank) and runs, inside
the ordinary Keras train step, its schedule's forward and backward passes
of the step's M micro-batches (schedules.py). A forward pass takes the
micro-batch (the first stage) or the previous stage's activations, and
sends its outputs on (all but the last); a backward pass starts from the
next stage's gradient of those outputs (the last stage: from the loss),
and sends the gradient of its inputs back. Each stage's passes are chained
in the schedule's order; the passes between stages are
transfer.py's alltoalls.

The micro-batches' gradients add up to the gradient of the whole batch
(each micro-batch's loss weighted by its share of the batch), which the
optimizer then reduces over the data-parallel replicas only (its process
set, hvdtrain.layout.data_set): one step of the whole model on the global
batch, as without a pipeline.

Every rank reads the whole batch: the first stage uses the inputs, the last
the targets. The last stage computes the loss and updates the metrics;
after each step (and each evaluation batch) the metric states are made the
same on every stage, so that Keras's logs, the callbacks and the checkpoints
see the same metrics everywhere. A stage's own regularization losses join
the loss there. A weight that several stages hold (a tied embedding and
head) gets the sum of their gradients on each of them.
"""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives, empty_batches
from hvdtrain.parallel.pipeline_parallel import schedules, stage_weights, transfer

__all__ = ["Pipeline"]


class Pipeline(keras.Model):
    """A model cut into stages (`hvdtrain.parallel.pipeline_parallel.cut`, or built
    so), trained with the ranks of each pipeline (hvdtrain.layout) running
    one stage each.

    Compile and fit it like any Keras model, with the same loss and metrics
    the whole model would have; the optimizer a `DistributedOptimizer` over
    `hvdtrain.layout.data_set()`. It cannot be compiled with XLA (its
    passes are Horovod alltoalls) or with a loss-scale optimizer (each
    stage would decide alone whether to skip a step).

    Args:
        stages: One built functional `keras.Model` per stage (every rank
            gives all of them; it keeps its own stage and the last stage's
            output shapes): the outputs of each are the inputs of the next.
            Those `cut` returns also hold the model they were cut from.
        microbatches: M: the micro-batches each batch is split into (M >= P
            keeps the bubble at (P - 1) / (M + P - 1) of a step).
        schedule: "1f1b" (at most P micro-batches' activations held) or
            "gpipe" (all M).
        name: The model's name.

    Raises:
        UsageError: If there are not as many stages as pipeline ranks, or
            `microbatches` or `schedule` is not valid.
    """

    def __init__(self, stages, microbatches, schedule="1f1b", name="pipeline"):
        super().__init__(name=name)
        whole = getattr(stages, "model", None)
        stages = list(stages)
        count = layout.pipeline_size()
        if len(stages) != count:
            raise UsageError(f"the model has {len(stages)} pipeline stages and the layout "
                             f"{count} (--pipeline_parallel): give one stage per pipeline rank")
        if not (isinstance(microbatches, int) and microbatches >= 1):
            raise UsageError(f"microbatches must be a positive integer, got {microbatches!r}")
        if schedule not in schedules.SCHEDULES:
            raise UsageError(f"pipeline schedule {schedule!r} is not one of "
                             f"{', '.join(schedules.SCHEDULES)}")
        self.stage_index = layout.pipeline_rank()
        self.stage_count = count
        self.microbatches = microbatches
        self.schedule = schedule
        self.stage = stages[self.stage_index]
        stage_weights.keep(self.stage.variables)   # the other stages' stay shapes
        self._actions = schedules.SCHEDULES[schedule](count, microbatches, self.stage_index)
        last = stages[-1]
        self._last_output_specs = [keras.KerasTensor(t.shape, t.dtype) for t in last.outputs]
        self._single_output = not isinstance(last.output, (list, tuple, dict))
        self._whole = _Untracked(whole or _joined(stages))
        self._tied = _tied(stages)
        if self._tied and count > 1:
            self._start_tied_alike()
        self.built = True

    @property
    def whole(self):
        """The whole model, sharing the stages' layers (on this rank only
        its stage's are trained): the model they were cut from, or the
        stages given called one after the other."""
        return self._whole.value

    def compile(self, optimizer="rmsprop", *args, jit_compile=False, **kwargs):
        """Keras's `compile`, refusing what a pipeline cannot do (see the class)."""
        if jit_compile is True:
            raise UsageError("a pipeline cannot be compiled with XLA (jit_compile): its passes "
                             "between stages are Horovod alltoalls, which XLA cannot hold")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise UsageError("a pipeline cannot use a loss-scale optimizer (mixed_float16): "
                             "each stage would decide alone whether to skip a step; use "
                             "mixed_bfloat16")
        super().compile(optimizer, *args, jit_compile=False, **kwargs)

    @property
    def first(self):
        return self.stage_index == 0

    @property
    def last(self):
        return self.stage_index == self.stage_count - 1

    def call(self, inputs, training=False):
        """The whole model's outputs on `inputs`, on every stage (one pass
        through the pipeline, the last stage's outputs sent to the others)."""
        if self.stage_count == 1:
            return self.stage(inputs, training=training)
        step = _Passes(self, "call")
        outputs = step.forward(inputs, 0, training)
        values = (keras.tree.flatten(outputs) if self.last
                  else [None] * len(self._last_output_specs))
        values = transfer.from_last_stage(values, self._last_output_specs,
                                          "hvdtrain.pipeline.call.output", after=step.sent)
        return values[0] if self._single_output else values

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        step = _Passes(self, "train", x, y, sample_weight)
        for action in self._actions:
            if action.kind == schedules.FORWARD:
                step.forward(step.microbatch_inputs(action.microbatch), action.microbatch,
                             training=True)
            else:
                step.backward(action.microbatch)
        if self._tied and self.stage_count > 1:
            self._sum_tied_gradients(step)
        self.optimizer.apply(step.gradients, self.stage.trainable_variables)
        return self._metrics_after(step, y)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        step = _Passes(self, "test", x, y, sample_weight)
        for i in range(self.microbatches):
            step.forward(step.microbatch_inputs(i), i, training=False)
        return self._metrics_after(step, y)

    def _start_tied_alike(self):
        """Gives each weight that several stages hold (`_tied`) the value
        of its first stage, on the others."""
        ranks = layout.current().pipeline_group(hvd.rank())   # by stage
        values = [_value_on(v, held[0] == self.stage_index) for v, held in self._tied]
        values = [hvd.broadcast(value, ranks[held[0]], name=f"hvdtrain.pipeline.tied.start.{j}",
                                process_set=layout.pipeline_set())
                  for j, (value, (_, held)) in enumerate(zip(values, self._tied))]
        for (variable, held), value in zip(self._tied, values):
            if self.stage_index in held:
                variable.assign(value)

    def _sum_tied_gradients(self, step):
        """The gradient of a weight that several stages hold is the sum of
        theirs (Megatron-LM's tied embedding and head): each then takes the
        same step."""
        index = {id(v): k for k, v in enumerate(self.stage.trainable_variables)}
        mine = []
        for variable, _ in self._tied:
            k = index.get(id(variable))
            gradient = None if k is None else step.gradients[k]
            mine.append(transfer.zeros(variable.shape, variable.dtype) if gradient is None
                        else tf.convert_to_tensor(gradient))
        mine[0] = transfer.depending_on(mine[0], step.sent)
        with collectives.root_name_scope():
            summed = hvd.grouped_allreduce(mine, op=hvd.Sum, name="hvdtrain.pipeline.tied",
                                           ignore_name_scope=True,
                                           process_set=layout.pipeline_set())
        for (variable, _), gradient in zip(self._tied, summed):
            if id(variable) in index:
                step.gradients[index[id(variable)]] = gradient

    def _metrics_after(self, step, y):
        """The logs of a step, the same on every stage: the last stage's
        metric states, its loss joined by the other stages' regularization."""
        if not self.last:
            self._build_metrics_as_the_last_stage(y)
        if self.last:
            self._loss_tracker.update_state(step.loss, sample_weight=step.batch)
        if self.stage_count > 1:
            self._share_metric_states(step)
        return self.get_metrics_result()

    def _build_metrics_as_the_last_stage(self, y):
        """The compiled metrics and losses' states, as the last stage has
        them (built there by their first update, from its outputs)."""
        outputs = self._last_output_specs
        outputs = outputs[0] if self._single_output else outputs
        for compiled in (self._compile_loss, self._compile_metrics):
            if compiled is not None and not compiled.built:
                compiled.build(y, outputs)

    def _share_metric_states(self, step):
        variables = self.metrics_variables
        flat = [tf.reshape(tf.cast(v, tf.float64), [-1]) for v in variables]
        if self.last:
            mine = tf.concat(flat, 0)
        else:
            # Only this stage's share of the loss: its regularization losses.
            mine = tf.concat([
                transfer.zeros(tf.shape(f), tf.float64)
                + (tf.cast(step.loss, tf.float64) * tf.cast(step.batch, tf.float64)
                   if v is self._loss_tracker.total else 0.0)
                for v, f in zip(variables, flat)], 0)
        mine = transfer.depending_on(mine, step.sent)
        with collectives.root_name_scope():
            summed = hvd.allreduce(mine, op=hvd.Sum, name=f"hvdtrain.pipeline.{step.kind}.metrics",
                                   ignore_name_scope=True, process_set=layout.pipeline_set())
        offset = 0
        for variable, values in zip(variables, flat):
            size = values.shape[0]
            variable.assign(tf.cast(tf.reshape(summed[offset:offset + size], variable.shape),
                                    variable.dtype))
            offset += size


class _Passes:
    """The passes of one step on this stage, built in the order they run:
    each waits for the one before it (the schedule's order, which bounds
    the activations held); the sends run when their tensors are ready."""

    def __init__(self, model, kind, x=None, y=None, sample_weight=None):
        self.model = model
        self.stage = model.stage
        self.kind = kind
        self.sent = []
        self._after = []
        self._tapes, self._inputs, self._outputs, self._objectives = {}, {}, {}, {}
        variables = self.stage.trainable_variables
        self._variables = variables
        self.gradients = [None] * len(variables)
        self.loss = tf.constant(0.0)
        self._x = self._y = self._weights = self._shares = None
        if x is None:
            return
        self.batch = tf.shape(keras.tree.flatten(x)[0])[0]
        count = model.microbatches
        sizes = self.batch // count + tf.cast(tf.range(count) < self.batch % count, tf.int32)
        self._shares = tf.cast(sizes, tf.float32) / tf.cast(tf.maximum(self.batch, 1), tf.float32)
        self._x = _split(x, sizes, count) if model.first else None
        self._y = _split(y, sizes, count) if model.last else None
        self._weights = _split(sample_weight, sizes, count) if model.last else None

    def microbatch_inputs(self, i):
        return self._x[i] if self._x is not None else None

    def forward(self, inputs, i, training):
        """Micro-batch `i` through this stage: its outputs (the last stage's
        are the model's)."""
        model = self.model
        with tf.control_dependencies(self._after):
            if not model.first:
                inputs = self._receive_activations(i)
            tape = tf.GradientTape() if training else _NoTape()
            with tape, collectives.occurrence(f"pipeline.{self.kind}.{i}"):
                # The inputs a gradient goes back for, by their place among all of them.
                watched = {j: t for j, t in enumerate(keras.tree.flatten(inputs))
                           if _differentiable(t)}
                if training and not model.first:
                    tape.watch(list(watched.values()))
                if training:
                    outputs = self.stage(inputs, training=True)
                else:   # a short batch's micro-batches may be empty
                    outputs = empty_batches.forward(
                        lambda x: self.stage(x, training=False), inputs)
                objective = self._objective(i, outputs, training)
            if not model.last:
                self.sent += [
                    transfer.send(t, +1, self._name("forward", model.stage_index, i, j))
                    for j, t in enumerate(keras.tree.flatten(outputs))]
        if training:
            self._tapes[i], self._inputs[i] = tape, watched
            self._outputs[i], self._objectives[i] = outputs, objective
        self._after = [t for t in keras.tree.flatten(outputs)]
        return outputs

    def backward(self, i):
        """The gradients of micro-batch `i`: added to the step's, and those
        of this stage's inputs sent back."""
        model = self.model
        tape = self._tapes.pop(i)
        inputs, outputs = self._inputs.pop(i), self._outputs.pop(i)
        objective = self._objectives.pop(i)
        with tf.control_dependencies(self._after):
            targets, seeds = [], []
            if not model.last:
                for j, t in enumerate(keras.tree.flatten(outputs)):
                    if _differentiable(t):
                        targets.append(t)
                        seeds.append(transfer.receive(
                            t, +1, self._name("backward", model.stage_index, i, j)))
            if objective is not None:
                targets.append(model.optimizer.scale_loss(objective))
                seeds.append(tf.ones_like(targets[-1]))
            gradients = tape.gradient(targets, self._variables + list(inputs.values()),
                                      output_gradients=seeds)
            count = len(self._variables)
            for k, g in enumerate(gradients[:count]):
                if g is not None:
                    self.gradients[k] = g if self.gradients[k] is None else _add(
                        self.gradients[k], g)
            if not model.first:
                for (j, t), g in zip(inputs.items(), gradients[count:]):
                    g = tf.zeros_like(t) if g is None else tf.convert_to_tensor(g)
                    self.sent.append(transfer.send(
                        g, -1, self._name("backward", model.stage_index - 1, i, j)))
        self._after = [g for g in gradients if g is not None]

    def _objective(self, i, outputs, training):
        """Micro-batch `i`'s share of what the step minimizes on this stage
        (None: nothing but the next stage's gradient), added to the step's
        loss: the loss and this stage's regularization on the last stage,
        the regularization elsewhere."""
        model = self.model
        share = 1.0 if self._shares is None else self._shares[i]
        if model.last:
            if self._y is None:
                return None
            loss = model._compute_loss(x=None, y=self._y[i], y_pred=outputs,
                                       sample_weight=self._weights[i], training=training)
            model.compute_metrics(None, self._y[i], outputs, sample_weight=self._weights[i])
        elif self.stage.losses:
            loss = tf.add_n([tf.cast(tf.reduce_sum(v), tf.float32) for v in self.stage.losses])
        else:
            return None
        objective = tf.cast(loss, tf.float32) * share
        self.loss = self.loss + objective
        return objective

    def _receive_activations(self, i):
        specs = self.stage.inputs
        received = [transfer.receive(t, -1, self._name("forward", self.model.stage_index - 1,
                                                       i, j))
                    for j, t in enumerate(specs)]
        return received[0] if len(received) == 1 else received

    def _name(self, direction, boundary, i, j):
        """The same on both stages of a boundary (numbered by its first stage)."""
        return f"hvdtrain.pipeline.{self.kind}.{direction}.{boundary}.{i}.{j}"


class _Untracked:
    """Holds a model out of Keras's tracking: the Pipeline's own weights
    are its stage's, not the whole model's."""

    def __init__(self, value):
        self.value = value


def _joined(stages):
    """Stages given as models of their own, as one functional model: each
    stage called on the outputs of the one before."""
    outputs = inputs = keras.tree.map_structure(
        lambda t: keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t.name), stages[0].input)
    for stage in stages:
        outputs = stage(outputs)
    return keras.Model(inputs, outputs, name="whole")


def _tied(stages):
    """[(variable, [stages holding it])] for each trainable variable that
    more than one stage holds, in the same order on every rank."""
    holders = {}
    for index, stage in enumerate(stages):
        for variable in stage.trainable_variables:
            holders.setdefault(id(variable), (variable, []))[1].append(index)
    return [(variable, held) for variable, held in holders.values() if len(held) > 1]


def _value_on(variable, holding):
    """The variable's value where this stage holds it first, else zeros to
    receive into (made at run time: see transfer.zeros)."""
    return tf.convert_to_tensor(variable) if holding else transfer.zeros(variable.shape,
                                                                          variable.dtype)


class _NoTape:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _differentiable(tensor):
    return tensor.dtype.is_floating


def _split(structure, sizes, count):
    """[the `i`th micro-batch of each tensor in `structure`, for i < count]."""
    if structure is None:
        return [None] * count
    parts = [tf.split(t, sizes, num=count) for t in keras.tree.flatten(structure)]
    return [keras.tree.pack_sequence_as(structure, [p[i] for p in parts]) for i in range(count)]


def _add(a, b):
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
