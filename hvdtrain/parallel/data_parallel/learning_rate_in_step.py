"""The learning rate set inside the train step from a schedule of the
global batch, with momentum correction: no Python between steps.

Keras's own `LearningRateSchedule` argument would be a function of the
optimizer's `iterations`, which is not the batch: a mixed_float16 step
skipped for its loss scale does not count, and a run resumed on another
number of workers counts its steps in other batches. Here the schedule is
called with hvdtrain's count of batches (set where each start of training
stands) and its value goes into the optimizer's own learning-rate variable,
which checkpoints keep and a plain Keras model loads.
"""

import tensorflow as tf

from hvdtrain.parallel.data_parallel import momentum_correction

__all__ = ["StepRate"]


class StepRate:
    """Sets a distributed optimizer's learning rate at each batch to
    `schedule(batch)`, `batch` counting the run's batches from 0 (set by
    `stand_at`), and makes its momentum follow (Goyal et al., 2017, 2.1): a
    step whose rate differs from the previous batch's uses momentum x new /
    old rate, for the optimizers Horovod corrects (Keras's SGD and RMSprop
    with momentum, also inside a LossScaleOptimizer).

    Give it with `hvdtrain.parallel.data_parallel.optimizer.set_step_rate` before the
    first step: the train step runs it when traced.

    Args:
        schedule: A `keras.optimizers.schedules.LearningRateSchedule` (or
            any callable) of the batch's index, an int64 tensor.
        momentum_correction: Whether to correct momentum when the rate changes.
    """

    def __init__(self, schedule, momentum_correction=True):
        self.schedule = schedule
        self.momentum_correction = momentum_correction
        self.batch = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdtrain_batch")

    def stand_at(self, batch):
        """The next batch trained is the run's `batch`-th (from 0)."""
        self.batch.assign(batch)

    def set(self, optimizer):
        """In the train step, at each batch: sets the rate and returns the
        momentum's ratio for the update (1: unchanged)."""
        rate = optimizer.learning_rate
        old = tf.identity(rate.value)
        new = tf.cast(self.schedule(self.batch.value()), rate.dtype)
        rate.assign(new)
        self.batch.assign_add(1)
        # From a rate of 0 no ratio exists (Horovod would divide by zero).
        return tf.where(tf.logical_and(old != 0, new != old), new / tf.where(old != 0, old, 1),
                        tf.ones_like(new))

    def corrected(self, optimizer, ratio, update):
        """Runs `update()` (an optimizer update) as if the momentum were
        momentum x `ratio` (momentum_correction.py)."""
        if not self.momentum_correction:
            return update()
        inner, slots = momentum_correction.momentum_slots(optimizer)
        if not slots:
            return update()
        changed = ratio != 1
        before = tf.identity(inner.iterations.value)
        tf.cond(changed, lambda: momentum_correction.scale_slots(slots, ratio), _nothing)
        result = update()
        applied = inner.iterations.value != before
        # No update (a loss-scale skip): the slots are as the step found them.
        tf.cond(tf.logical_and(changed, tf.logical_not(applied)),
                lambda: momentum_correction.unscale_slots(slots, ratio), _nothing)
        if getattr(inner, "nesterov", False):
            tf.cond(tf.logical_and(changed, applied),
                    lambda: momentum_correction.nesterov_look_ahead(inner, slots, ratio), _nothing)
        return result


def _nothing():
    """The branch of a tf.cond that changes nothing."""
