"""The learning rate's shape over training, by name: warm-up, then a
schedule, each a multiplier of the rate scaled for the replicas as a
function of the (fractional) epoch.

Each formula is written once and evaluated with Python numbers (`PYTHON`:
the Horovod-style callbacks, checks) or TensorFlow tensors (the train step,
hvdtrain.parallel.data_parallel.learning_rate_in_step) by the `ops` it is given. Importing this
module loads no TensorFlow, so that the settings can be checked first.
"""

import math
import types

from hvdtrain.errors import UsageError

__all__ = ["AFTER_WARMUP", "PLATEAU", "PYTHON", "after_warmup", "warmup"]

# The operations the formulas use, on Python numbers.
PYTHON = types.SimpleNamespace(cos=math.cos, floor=math.floor, minimum=min,
                               where=lambda condition, yes, no: yes if condition else no)


def warmup(epoch, warmup_epochs, replicas, steps_per_epoch, ops=PYTHON):
    """The multiplier of warm-up at `epoch` (fractional: the batch being
    started is `epoch * steps_per_epoch`): from one replica's rate,
    1 / replicas, a batch's worth up, linearly to 1 at `warmup_epochs`
    (Goyal et al., 2017; Horovod's formula), and 1 after it."""
    # Counting the batch being started makes each epoch end on a round value.
    epoch = ops.minimum(epoch + 1.0 / steps_per_epoch, warmup_epochs)
    return (epoch * (replicas - 1) / warmup_epochs + 1) / replicas


def _constant(epochs, warmup_epochs):
    return lambda epoch, ops=PYTHON: 1.0


def _cosine(epochs, warmup_epochs):
    """Decay to 0 at the last epoch."""
    return lambda epoch, ops=PYTHON: 0.5 * (1 + ops.cos(
        math.pi * (epoch - warmup_epochs) / (epochs - warmup_epochs)))


def _step(epochs, warmup_epochs):
    """x0.1 at half and again at three quarters of the epochs (He et al., 2016)."""
    def multiplier(epoch, ops=PYTHON):
        epoch = ops.floor(epoch)
        return ops.where(epoch >= epochs * 3 / 4, 0.1 ** 2,
                         ops.where(epoch >= epochs / 2, 0.1, 1.0))
    return multiplier


# Name -> f(epochs, warmup_epochs) -> multiplier(epoch, ops): the
# --lr_schedule choices that are functions of the epoch.
AFTER_WARMUP = {"constant": _constant, "cosine": _cosine, "step": _step}

# The choice that follows a metric instead (callbacks.PlateauLearningRate).
PLATEAU = "plateau"


def after_warmup(name, epochs, warmup_epochs):
    """The multiplier(epoch, ops=PYTHON) of schedule `name` for a run of
    `epochs` with `warmup_epochs` of warm-up; a UsageError names an unknown
    schedule."""
    if name not in AFTER_WARMUP:
        raise UsageError(f"unknown learning-rate schedule '{name}'; "
                         f"choose one of {', '.join(AFTER_WARMUP)}")
    return AFTER_WARMUP[name](epochs, warmup_epochs)
