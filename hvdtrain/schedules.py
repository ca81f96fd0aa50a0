"""The learning-rate schedules after warm-up, by name: each a multiplier of
the scaled rate as a function of the (fractional) epoch. Plain Python, so
that the settings can be checked before TensorFlow loads."""

import math

from hvdtrain.errors import UsageError

__all__ = ["AFTER_WARMUP", "PLATEAU", "after_warmup"]


def _constant(epochs, warmup_epochs):
    return lambda epoch: 1.0


def _cosine(epochs, warmup_epochs):
    """Decay to 0 at the last epoch."""
    return lambda epoch: 0.5 * (1 + math.cos(
        math.pi * (epoch - warmup_epochs) / (epochs - warmup_epochs)))


def _step(epochs, warmup_epochs):
    """x0.1 at half and again at three quarters of the epochs (He et al., 2016)."""
    def multiplier(epoch):
        epoch = math.floor(epoch)
        return 0.1 ** ((epoch >= epochs / 2) + (epoch >= epochs * 3 / 4))
    return multiplier


# Name -> f(epochs, warmup_epochs) -> multiplier(epoch): the --lr_schedule
# choices that are functions of the epoch.
AFTER_WARMUP = {"constant": _constant, "cosine": _cosine, "step": _step}
# The choice that follows a metric instead (callbacks.PlateauLearningRate).
PLATEAU = "plateau"


def after_warmup(name, epochs, warmup_epochs):
    """The multiplier(epoch) of schedule `name` for a run of `epochs` with
    `warmup_epochs` of warm-up; a UsageError names an unknown schedule."""
    if name not in AFTER_WARMUP:
        raise UsageError(f"unknown learning-rate schedule '{name}'; "
                         f"choose one of {', '.join(AFTER_WARMUP)}")
    return AFTER_WARMUP[name](epochs, warmup_epochs)
