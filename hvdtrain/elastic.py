"""Horovod elastic training for Keras 3 models.

Horovod's `TensorFlowKerasState` and its Keras elastic callbacks are Keras 2
only (they read `optimizer.variables()` and broadcast with Horovod's
`broadcast_variables`, which fails on Keras 3 variables). These are their
Keras 3 equivalents, with the same names and meaning:

    state = hvdtrain.elastic.KerasState(model, epoch=0, batch=0)
    state.register_reset_callbacks([rescale_learning_rate])

    @hvdtrain.elastic.run
    def train(state):
        model.fit(dataset_from(state.epoch, state.batch), steps_per_epoch=steps,
                  epochs=epochs - state.epoch, callbacks=[
                      UpdateEpochStateCallback(state), UpdateBatchStateCallback(state),
                      CommitStateCallback(state, batches_per_commit=10)])

    train(state)

When workers leave or join, every worker goes back to the last commit, Horovod
restarts with the new world size, rank 0's state is broadcast and `train` runs
again. What depends on the world size must then be redone: `KerasState`
retraces the model's train step (the traced one has the old size in it), the
reset callbacks rescale the learning rate, and `train` shards its data by the
new rank and size.

`hvdtrain train` does all this when horovodrun starts it in elastic mode
(see trainer.py), with UpdatePositionStateCallback in place of the two
Update*StateCallbacks.
"""

import functools
import os

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import collectives, runtime, watchdog
from hvdtrain.errors import UsageError, lost_peer
from hvdtrain.training_state import Position, training_variables


def launched():
    """True in a worker that horovodrun started in elastic mode (with
    --min-np, --max-np or --host-discovery-script): its elastic driver sets
    HOROVOD_ELASTIC=1 for the workers."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


class KerasState(ObjectState):
    """A Keras 3 model's and optimizer's variables, plus the keyword arguments
    (e.g. `epoch=0, batch=0`) as attributes, kept in step across workers.

    `commit()` copies the variables to host memory (and raises
    `HostsUpdatedInterrupt` when hosts were added or removed), `restore()`
    puts the last copy back, `sync()` sets every worker to rank 0's state.
    """

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is None:
            raise UsageError("KerasState needs an optimizer: compile the model or pass one")
        if not model.built:
            raise UsageError("KerasState needs a built model (give it an Input or call "
                             "model.build(input_shape))")
        if not self.optimizer.built:
            # Its variables (slots, iteration count) are part of the state.
            self.optimizer.build(model.trainable_variables)
        self._save_variables()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for variable, value in zip(self._variables(), self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self):
        collectives.broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()

    def reset(self):
        # Keras keeps the traced train step across fits, and hvdtrain's
        # gradient reduction reads the world size while tracing (no allreduce
        # at size 1, 1/size factors): trace it again for the new size.
        if self.model.compiled:
            self.model.make_train_function(force=True)

    def _variables(self):
        return training_variables(self.model, self.optimizer)

    def _save_variables(self):
        self._saved_values = [np.array(v) for v in self._variables()]


def run(func):
    """Horovod's `elastic.run` for TensorFlow: runs `func(state, ...)` and,
    when a worker fails (then `state` goes back to its last commit) or hosts
    are added or removed (noticed at a commit), restarts Horovod with the
    new workers, syncs `state` from rank 0 and runs `func` again.

    Code that runs before the first call must not use collectives: a worker
    that joins runs it while the others are syncing.
    """
    @functools.wraps(func)
    def recoverable(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as error:
            # Horovod's own check looks for op names in the message (missing
            # HorovodGroupedAllreduce) and returns None on other errors.
            if lost_peer(error):
                raise HorovodInternalError(error) from error
            raise

    return run_fn(recoverable, _reset)


def _reset():
    # The elastic driver bounds the wait for workers (horovodrun --elastic-timeout).
    with watchdog.paused("restarting with the new workers"):
        hvd.shutdown()
        hvd.init()
    # Ranks can change (the old rank 0 may be gone).
    runtime.set_log_verbosity()


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at the end of
    each epoch. Put it after the Update*StateCallbacks, so that it commits
    the counters they updated for the same batch.

    An epoch's last batch is committed by the epoch's end, after the work
    done there: a restart then never resumes an epoch with no batch left,
    which Keras could not run without taking one more.
    """

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        # Counted from each (re)start, so every worker commits at the same batches.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.batches_remaining = self.batches_per_commit
            steps = self.params.get("steps")
            # UpdateBatchStateCallback stops a resumed epoch at its last batch.
            if not (self.model.stop_training or (steps and batch + 1 >= steps)):
                self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps in `state.batch` the number of batches done in the current epoch
    (0 once it ends), and ends the epoch that a restart resumes after the
    `steps - state.batch` batches it has left.

    Horovod stores the last batch's index (so a resumed epoch repeats one)
    and shortens the epoch through `params["steps"]`, which Keras 3's loop
    does not read; here the resumed epoch is ended with `model.stop_training`,
    cleared again at the epoch's end. Put the elastic callbacks before any
    that stop training at an epoch's end (e.g. EarlyStopping).
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._done_before = 0
        self._ended_epoch = False

    def on_train_begin(self, logs=None):
        self._done_before = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last step run (several with steps_per_execution).
        self.state.batch = self._done_before + batch + 1
        steps = self.params.get("steps")
        if self._done_before and steps and self.state.batch >= steps:
            self.model.stop_training = True
            self._ended_epoch = True

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._done_before = 0
        if self._ended_epoch:
            self.model.stop_training = False
            self._ended_epoch = False


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps in `state.epoch` the number of epochs done, across restarts:
    fit with `epochs=total - state.epoch` (or `initial_epoch=state.epoch,
    epochs=total`)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        # A restart restores `epoch` with the variables, so counting is safe.
        self.state.epoch += 1


class UpdatePositionStateCallback(keras.callbacks.Callback):
    """Keeps in `state.position` the training_state.Position training stands at
    (the batch after the last one done), in a run of `steps` batches of
    `batch_size` per worker on the current workers: what
    `training_state.continue_at` maps to the workers there are after a restart.

    Unlike UpdateBatchStateCallback it never ends an epoch early: fit a
    resumed epoch's rest with its own steps, and give this callback the
    batch numbers of the whole epoch (fit.ContinuedEpoch does).
    """

    def __init__(self, state, steps, batch_size):
        super().__init__()
        self.state = state
        self.steps = steps
        self.batch_size = batch_size
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._stand_at(self._epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self._stand_at(epoch + 1, 0)

    def _stand_at(self, epoch, step):
        self.state.position = Position(epoch, step, self.steps, hvd.size(), self.batch_size)
