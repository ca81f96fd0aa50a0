"""Horovod's `horovod.tensorflow.keras.elastic` for Keras 3: Horovod's
names over hvdtrain.state.elastic_state (KerasState, run) and hvdtrain's commit
callback, and Horovod's two position callbacks, which `hvdtrain train`
replaces with callbacks.TrackPosition.

    state = hvdtrain.keras.elastic.KerasState(model, epoch=0, batch=0)
    state.register_reset_callbacks([rescale_learning_rate])

    @hvdtrain.keras.elastic.run
    def train(state):
        model.fit(dataset_from(state.epoch, state.batch), steps_per_epoch=steps,
                  epochs=epochs - state.epoch, callbacks=[
                      UpdateEpochStateCallback(state), UpdateBatchStateCallback(state),
                      CommitStateCallback(state, batches_per_commit=10)])

    train(state)
"""

import keras

from hvdtrain.callbacks import CommitState
from hvdtrain.state.elastic_state import KerasState, run

__all__ = ["CommitStateCallback", "KerasState", "TensorFlowKerasState",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class TensorFlowKerasState(KerasState):
    """Horovod's base of KerasState; `backend` (a Keras 2 session holder) is
    accepted for compatibility: Keras 3 runs eagerly."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        super().__init__(model, optimizer, **kwargs)


class CommitStateCallback(CommitState):
    """Horovod's name for hvdtrain.callbacks.CommitState: put it after the
    Update*StateCallbacks, so that it commits the counters they updated for
    the same batch (UpdateBatchStateCallback stops a resumed epoch at its
    last batch, which the epoch's end commits)."""


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps in `state.batch` the number of batches done in the current epoch
    (0 once it ends), and ends the epoch that a restart resumes after the
    `steps - state.batch` batches it has left.

    Horovod stores the last batch's index (so a resumed epoch repeats one)
    and shortens the epoch through `params["steps"]`, which Keras 3's loop
    does not read; here the resumed epoch is ended with `model.stop_training`,
    cleared again at the epoch's end. Put the elastic callbacks before any
    that stop training at an epoch's end (e.g. EarlyStopping).

    Args:
        state: The `KerasState` whose `batch` it keeps.
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
    epochs=total`).

    Args:
        state: The `KerasState` whose `epoch` it keeps.
    """

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        # A restart restores `epoch` with the variables, so counting is safe.
        self.state.epoch += 1
