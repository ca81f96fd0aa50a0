"""Momentum correction (Goyal et al., 2017, 2.1): a step whose learning rate
differs from the previous step's uses momentum x new / old rate, for the
optimizers Horovod corrects (Keras's SGD and RMSprop with momentum, also
inside a LossScaleOptimizer).

Keras 3 bakes `momentum` into the traced step (Horovod changes the
attribute instead), so the step's velocity slots are scaled by the ratio
before the update and, when no update came of it (gradients accumulated, a
loss-scale skip), scaled back. Written once, with TensorFlow ops that run
eagerly (the Horovod-style callback, between steps) and in the train step
(hvdtrain's own rate, learning_rate_in_step.py).
"""

import keras
import tensorflow as tf

__all__ = ["momentum_slots", "nesterov_look_ahead", "scale_slots", "unscale_slots"]


def momentum_slots(optimizer):
    """(the optimizer that updates, its momentum slots): SGD `v = momentum *
    v - lr * g` and RMSprop `v = momentum * v + lr * g / rms` apply `v`, so
    scaling `v` by a ratio before the update is using momentum x ratio in
    it. Slots are () for optimizers without momentum."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    if not optimizer.built or not getattr(optimizer, "momentum", 0):
        return optimizer, ()
    if isinstance(optimizer, keras.optimizers.SGD):
        return optimizer, optimizer.momentums
    if isinstance(optimizer, keras.optimizers.RMSprop):
        return optimizer, optimizer._momentums   # no public name
    return optimizer, ()


def scale_slots(slots, ratio):
    """Multiplies each slot by `ratio`, before an update."""
    for slot in slots:
        slot.assign(slot.value * tf.cast(ratio, slot.dtype))


def unscale_slots(slots, ratio):
    """Divides each slot by `ratio`: `scale_slots` undone, when no update
    came of it."""
    for slot in slots:
        slot.assign(slot.value / tf.cast(ratio, slot.dtype))


def nesterov_look_ahead(optimizer, slots, ratio):
    """After an update with scaled slots: Nesterov SGD reads momentum once
    more, `w += momentum * v - lr * g`, and the missing `momentum * (ratio -
    1) * v` goes to the weights. Nothing for other optimizers."""
    if not getattr(optimizer, "nesterov", False):
        return
    extra = optimizer.momentum * (tf.cast(ratio, tf.float64) - 1)
    # The slots follow the order of the variables the optimizer was built with.
    for variable, slot in zip(optimizer._trainable_variables, slots):
        variable.assign_add(slot.value * tf.cast(extra, slot.dtype))
