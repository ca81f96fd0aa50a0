"""The learning rate set between steps from a multiplier of the
(fractional) epoch, with momentum correction: Horovod's callback (hvdtrain
train sets its rate inside the step instead: parallel/data_parallel/learning_rate_in_step.py)."""

from hvdtrain.callbacks.base import TrainingCallback
from hvdtrain.parallel.data_parallel import momentum_correction
from hvdtrain.parallel.data_parallel.optimizer import accumulated_only

__all__ = ["ScheduledLearningRate"]


class ScheduledLearningRate(TrainingCallback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` while
    `start_epoch <= epoch < end_epoch`, as Horovod 0.28's
    LearningRateScheduleCallback does.

    With `staircase` the rate changes at the first batch of each epoch;
    otherwise at every batch, with a fractional epoch
    `epoch + batch / steps_per_epoch`. A constant `multiplier` means
    exponential decay: `multiplier ** (epoch - start_epoch)`.

    With `momentum_correction`, a step whose rate differs from the previous
    step's uses momentum x new / old rate (Goyal et al., 2017, section 2.1),
    for the optimizers Horovod corrects: Keras's SGD and RMSprop with
    momentum, also inside a LossScaleOptimizer; others are left alone.

    Args:
        initial_lr: The rate the multiplier scales.
        multiplier: A function of the epoch (fractional unless `staircase`),
            or a number: the factor per epoch since `start_epoch`.
        start_epoch: The first epoch (0-based) this callback sets the rate in.
        end_epoch: The epoch it stops at (not included); None: the end.
        staircase: Whether the rate changes only at epochs' starts.
        momentum_correction: Whether to correct momentum when the rate changes.
        steps_per_epoch: The batches of an epoch; None: Keras's count (fit's
            `steps_per_epoch`, or a dataset of known length).

    Raises:
        ValueError: `initial_lr` is None, or without `staircase` the batches
            per epoch are not known when training starts.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required")
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self._correction = None
        self._last_set = None   # (rate given, rate stored) of the last assignment

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: pass steps_per_epoch "
                                 "(the dataset's length is unknown)")

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch < self.start_epoch or (
                self.end_epoch is not None and self.epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set_learning_rate(self.epoch)
        else:
            self._set_learning_rate(self.epoch + batch / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self._correction is not None:
            self._correction.end()
            self._correction = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)

    def _set_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = float(optimizer.learning_rate)
        lr = self.initial_lr * self.multiplier(epoch)
        if self._last_set == (lr, old_lr):
            # The rate this callback set last, still in place (a constant
            # stretch, or warm-up on one worker): assigning it again costs
            # more than the check.
            return
        optimizer.learning_rate = lr
        new_lr = float(optimizer.learning_rate)  # as stored, in float32
        self._last_set = (lr, new_lr)
        # From a rate of 0 no ratio exists (Horovod would divide by zero).
        if self.momentum_correction and old_lr != 0 and new_lr != old_lr:
            self._correction = _MomentumCorrection.begin(optimizer, new_lr / old_lr)


class _MomentumCorrection:
    """Runs one step as if the optimizer's momentum were `momentum * ratio`
    (parallel/data_parallel/momentum_correction.py)."""

    def __init__(self, optimizer, slots, ratio, applying):
        self.optimizer = optimizer
        self.applying = applying
        self.slots = slots
        self.ratio = ratio
        self.iterations = int(optimizer.iterations)
        momentum_correction.scale_slots(slots, ratio)

    @classmethod
    def begin(cls, optimizer, ratio):
        """The correction for this step, or None if `optimizer` has no momentum."""
        # The distributed one given knows whether it only accumulated.
        updating, slots = momentum_correction.momentum_slots(optimizer)
        return cls(updating, slots, ratio, optimizer) if slots else None

    def end(self):
        if (int(self.optimizer.iterations) == self.iterations
                or accumulated_only(self.applying)):
            # No update this batch (gradients being accumulated, or a loss-scale
            # skip): the slots are as the step left them, so undo the scaling.
            momentum_correction.unscale_slots(self.slots, self.ratio)
        else:
            momentum_correction.nesterov_look_ahead(self.optimizer, self.slots, self.ratio)
