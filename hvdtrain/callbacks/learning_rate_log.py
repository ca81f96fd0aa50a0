"""The learning rate in each epoch's logs."""

from hvdtrain.callbacks.base import TrainingCallback

__all__ = ["LearningRateLog"]


class LearningRateLog(TrainingCallback):
    """Adds the rate of the epoch's last step to its logs as
    `learning_rate`, for the progress line, the history, the run log and
    TensorBoard (the step sets the rate: hvdtrain.run.learning_rate)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)
