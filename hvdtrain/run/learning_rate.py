"""A run's learning rate as a function of the batch: --learning_rate scaled
for the data-parallel replicas, warmed up over --warmup_epochs from one
replica's rate, then --lr_schedule (or lowered on a plateau). The train step
sets it at every batch (hvdtrain.parallel.data_parallel.learning_rate_in_step); a constant rate
needs no work there."""

import keras
import tensorflow as tf

from hvdtrain import lr_schedules
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib
from hvdtrain.parallel.data_parallel.learning_rate_in_step import StepRate

__all__ = ["TrainingRate", "set_up", "stand_at"]


def _where(condition, yes, no):
    return tf.where(condition, tf.convert_to_tensor(yes, tf.float64),
                    tf.convert_to_tensor(no, tf.float64))


# The operations schedules' formulas use, on float64 tensors.
_TENSORFLOW = type(lr_schedules.PYTHON)(cos=tf.math.cos, floor=tf.math.floor,
                                      minimum=tf.minimum, where=_where)


class TrainingRate(keras.optimizers.schedules.LearningRateSchedule):
    """The rate of batch `batch` (counted from 0 over the run), computed in
    float64 as hvdtrain.lr_schedules' formulas are in Python.

    What depends on the workers is set by `start` at each start of training
    (a run may resume on another number of them); a plateau's lowerings by
    `lower`.

    Args:
        learning_rate: One replica's rate (--learning_rate).
        epochs: The run's epochs.
        warmup_epochs: Epochs of warm-up (0: none); warm-up holds while the
            epoch begun is below it, so a fractional one holds its final
            rate to the next whole epoch.
        schedule: A name of lr_schedules.AFTER_WARMUP, or lr_schedules.PLATEAU.
    """

    def __init__(self, learning_rate, epochs, warmup_epochs, schedule):
        self.learning_rate = learning_rate
        self.epochs = epochs
        self.warmup_epochs = warmup_epochs
        self.schedule = schedule
        self._after = (None if schedule == lr_schedules.PLATEAU
                       else lr_schedules.after_warmup(schedule, epochs, warmup_epochs))
        self.steps_per_epoch = tf.Variable(1, dtype=tf.int64, trainable=False)
        self.replicas = tf.Variable(1, dtype=tf.float64, trainable=False)
        self.lowered = tf.Variable(1, dtype=tf.float64, trainable=False)   # by a plateau

    def start(self, steps_per_epoch, replicas):
        self.steps_per_epoch.assign(steps_per_epoch)
        self.replicas.assign(replicas)

    def lower(self, factor):
        """The rate after warm-up is the schedule's x `factor` from now on."""
        self.lowered.assign(factor)

    def __call__(self, batch):
        steps = tf.cast(self.steps_per_epoch, tf.float64)
        batch = tf.cast(batch, tf.float64)
        epoch = tf.floor(batch / steps)
        fractional = epoch + (batch - epoch * steps) / steps
        scaled = self.learning_rate * self.replicas
        after = self.lowered if self._after is None else (
            self._after(fractional, _TENSORFLOW) * self.lowered)
        if not self.warmup_epochs:
            return scaled * after
        warm = lr_schedules.warmup(fractional, self.warmup_epochs, self.replicas, steps,
                                   _TENSORFLOW)
        return tf.where(epoch < self.warmup_epochs, scaled * warm, scaled * after)

    def get_config(self):
        return dict(learning_rate=self.learning_rate, epochs=self.epochs,
                    warmup_epochs=self.warmup_epochs, schedule=self.schedule)


def set_up(optimizer, config):
    """Has `optimizer` (distributed) set `config`'s rate in its train step,
    unless that rate is constant; `stand_at` starts it. Before the first
    step: the step is traced then."""
    if config.warmup_epochs or config.lr_schedule != "constant":
        optimizer_lib.set_step_rate(optimizer, StepRate(TrainingRate(
            config.learning_rate, config.epochs, config.warmup_epochs, config.lr_schedule)))


def stand_at(optimizer, config, batch, steps_per_epoch, replicas):
    """Starts the rate of a start of training whose next batch is the run's
    `batch`-th, on `replicas` replicas taking `steps_per_epoch` batches an
    epoch. A constant rate is set here: a checkpoint's was scaled for the
    replicas it was written on."""
    rate = optimizer_lib.step_rate(optimizer)
    if rate is None:
        optimizer.learning_rate = config.learning_rate * replicas
        return
    rate.schedule.start(steps_per_epoch, replicas)
    rate.stand_at(batch)
