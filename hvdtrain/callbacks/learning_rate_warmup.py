"""Linear learning-rate warm-up to the rate scaled for the workers."""

from absl import logging

from hvdtrain import layout, lr_schedules
from hvdtrain.callbacks.learning_rate_schedule import ScheduledLearningRate

__all__ = ["LearningRateWarmup"]


class LearningRateWarmup(ScheduledLearningRate):
    """Raises the learning rate linearly from `initial_lr / size` (one
    worker's rate) to `initial_lr` (the rate scaled for `size` workers) over
    the first `warmup_epochs` epochs, batch by batch (Goyal et al., 2017).

    Args:
        initial_lr: The rate at the end of warm-up, scaled for the workers.
        warmup_epochs: Epochs of warm-up; a fraction ends inside an epoch,
            and the full rate holds from there.
        momentum_correction: As in ScheduledLearningRate.
        steps_per_epoch: As in ScheduledLearningRate.
        verbose: Whether to log the rate when warm-up ends.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            return lr_schedules.warmup(epoch, warmup_epochs, layout.data_size(),
                                       self.steps_per_epoch)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose and epoch == self.end_epoch - 1:
            logging.info("epoch %d: learning rate warm-up done, at %g",
                         epoch + 1, float(self.model.optimizer.learning_rate))
