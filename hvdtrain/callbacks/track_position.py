"""Elastic training's position, kept in its state for a restart, with the
state of the callbacks that keep one."""


from hvdtrain import layout
from hvdtrain.callbacks.base import TrainingCallback, kept_states
from hvdtrain.state.training_state import Position

__all__ = ["TrackPosition"]


class TrackPosition(TrainingCallback):
    """Keeps in `state.position` the training_state.Position training stands
    at (the batch after the last one done), in a run of batches of
    `batch_size` per worker on the current workers: what
    `training_state.continue_at` maps to the workers there are after a
    restart.

    It never ends an epoch early (Horovod's UpdateBatchStateCallback does):
    fit a resumed epoch's rest with its own steps, and give this callback
    the batch numbers of the whole epoch (fit.EpochSteps does).

    Args:
        state: The `hvdtrain.elastic.KerasState` whose `position` it sets.
        batch_size: Examples per batch on each worker, kept in the position
            so that it can be mapped onto another batch size or number of
            workers.
        kept: Callbacks whose state (base.KeptState) is kept in
            `state.kept_states` at each epoch's end; put this callback
            after them.
    """

    def __init__(self, state, batch_size, kept=()):
        super().__init__()
        self.state = state
        self.batch_size = batch_size
        self.kept = kept

    def on_train_batch_end(self, batch, logs=None):
        self._stand_at(self.epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self._stand_at(epoch + 1, 0)
        if self.kept:
            self.state.kept_states = kept_states(self.kept)

    def _stand_at(self, epoch, step):
        self.state.position = Position(epoch, step, self.params["steps"], layout.data_size(),
                                       self.batch_size)
