"""Training steps run K at a time in one call of a compiled function
(Keras's `steps_per_execution`), and what a call carries out of the graph.

Each step is the model's own train step, its gradients reduced as always;
between calls the callbacks run, once per execution. Keras 3 runs every call
K steps and, given `steps_per_epoch`, lets an epoch's last call take batches
of the next epoch when K does not divide the epoch (its iterator runs on).
Here an epoch's last execution stops at the epoch's end, as Keras 2 did:
each epoch trains its own batches, validation and checkpoints fall where
they would one step at a time, and K steps per call train the very steps
K = 1 does.

Values the callbacks read after each call (the ranks' stop vote) are read
in the graph at its end and returned with the logs: one transfer per call,
no eager read of a variable per step.
"""

import keras
import tensorflow as tf

__all__ = ["ExecutionLength", "Executions", "of"]


class Executions:
    """Makes `model`'s train function run up to `steps_per_execution`
    steps per call. Made before the model's first fit (the train function
    is traced then); `fit.from_position` gives each fit the
    `ExecutionLength` callback that cuts an epoch's last call.

    Args:
        model: A compiled Keras model.
        steps_per_execution: K, the steps of a call.

    Attributes:
        read_at_call_end: After each call, {name: value} of what
            `read_at_each_call_end` asked for.
    """

    def __init__(self, model, steps_per_execution):
        self.model = model
        self.steps_per_execution = steps_per_execution
        self.read_at_call_end = {}
        self._reads = {}
        self._length = tf.Variable(steps_per_execution, dtype=tf.int32, trainable=False,
                                   name="hvdtrain_execution_length")
        self._planned = steps_per_execution
        # Keras's fit asks the model for its train function, and numbers
        # each call's steps from this.
        model.steps_per_execution = steps_per_execution
        model.make_train_function = self.make_train_function
        model.train_function = None
        model._hvdtrain_executions = self

    def read_at_each_call_end(self, name, read):
        """Returns `read()` (a tensor read in the graph after each call's
        last step) in `read_at_call_end[name]`; returns a function that
        gives the last call's. Call it before the first step."""
        self._reads[name] = read
        self.model.train_function = None
        return lambda: self.read_at_call_end[name]

    def plan(self, steps_left):
        """The next call takes at most `steps_left` steps (the epoch's rest)."""
        length = min(self.steps_per_execution, steps_left)
        if length != self._planned:   # once at an epoch's end, and back
            self._length.assign(length)
            self._planned = length

    def make_train_function(self, force=False):
        """Keras's Model.make_train_function, for this model."""
        model = self.model
        if model.train_function is not None and not force:
            return model.train_function
        # One step, traced once for the call's first step and the loop's (as Keras does).
        step = tf.function(tf.autograph.experimental.do_not_convert(model.train_step),
                           reduce_retracing=True)

        @tf.autograph.experimental.do_not_convert
        def execute(iterator):
            logs = step(iterator.get_next())
            if self.steps_per_execution > 1:
                _, logs = tf.while_loop(
                    lambda done, logs: done < self._length,
                    lambda done, logs: (done + 1, step(iterator.get_next())),
                    (tf.constant(1), logs), parallel_iterations=1)   # steps in order
            return logs, {name: read() for name, read in self._reads.items()}

        execute = tf.function(execute, reduce_retracing=True)

        def train_function(iterator):
            logs, self.read_at_call_end = execute(iterator)
            return logs

        model.train_function = train_function
        return train_function


def of(model):
    """The model's Executions, or None (a train function of Keras's own)."""
    return getattr(model, "_hvdtrain_executions", None)


class ExecutionLength(keras.callbacks.Callback):
    """Cuts each epoch's last execution at the epoch's end: before each call
    it plans the steps left of the fit's epoch (Keras numbers a call's first
    step `batch`)."""

    def __init__(self, executions):
        super().__init__()
        self.executions = executions

    def on_train_batch_begin(self, batch, logs=None):
        self.executions.plan(self.params["steps"] - batch)
