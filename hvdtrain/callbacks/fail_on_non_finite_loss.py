"""Every rank stops as soon as one rank's loss is NaN or infinite."""

import math

import horovod.tensorflow as hvd

from hvdtrain.callbacks.base import CallSteps, TrainingCallback
from hvdtrain.errors import TrainingError

__all__ = ["FailOnNonFiniteLoss"]


class FailOnNonFiniteLoss(CallSteps, TrainingCallback):
    """Ends training with a TrainingError naming the epoch, step and rank as
    soon as this rank's loss is NaN or infinite. The launcher then stops the
    other ranks (their next collective waits for this one in vain), so the
    job ends at once instead of training on a diverged model.

    The loss it reads is the epoch's running mean, which a step's NaN keeps:
    with several steps per call of the train function, one check after each
    call sees every step's, and names the call's steps."""

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            steps = f"step {batch + 1}" if batch == self.call_first else (
                f"steps {self.call_first + 1}-{batch + 1}")
            raise TrainingError(
                f"the loss is {float(loss)} at epoch {self.epoch + 1}, {steps} "
                f"on rank {hvd.rank()}; lower --learning_rate or check the data, then "
                "resume from the last checkpoint (or keep going with --nan_policy=ignore)")
