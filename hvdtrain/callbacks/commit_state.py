"""Elastic training's commits, every few batches and at each epoch's end."""

import keras

from hvdtrain.callbacks.base import CallSteps

__all__ = ["CommitState"]


class CommitState(CallSteps, keras.callbacks.Callback):
    """Commits `state` (an hvdtrain.elastic.KerasState) every
    `batches_per_commit` batches and at the end of each epoch. Put it after
    the callbacks that update the state's position, so that it commits the
    position they set for the same batch.

    An epoch's last batch is committed by the epoch's end, after the work
    done there: a restart then never resumes an epoch with no batch left,
    which Keras could not run without taking one more.

    Args:
        state: The `hvdtrain.elastic.KerasState` to commit.
        batches_per_commit: Batches between commits, counted from each
            (re)start of training so that every worker commits at the same
            batches; with several steps per call of the train function, at
            the end of the call that reaches them.
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
        self.batches_remaining -= self.call_steps(batch)
        if self.batches_remaining <= 0:
            self.batches_remaining = self.batches_per_commit
            steps = self.params.get("steps")
            if not (self.model.stop_training or (steps and batch + 1 >= steps)):
                self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()
