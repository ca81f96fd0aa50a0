"""Every rank stops as soon as one rank's loss is NaN or infinite."""

import math

import horovod.tensorflow as hvd

from hvdtrain.callbacks.base import TrainingCallback
from hvdtrain.errors import TrainingError

__all__ = ["FailOnNonFiniteLoss"]


class FailOnNonFiniteLoss(TrainingCallback):
    """Ends training with a TrainingError naming the epoch, step and rank as
    soon as this rank's loss is NaN or infinite. The launcher then stops the
    other ranks (their next collective waits for this one in vain), so the
    job ends at once instead of training on a diverged model."""

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise TrainingError(
                f"the loss is {float(loss)} at epoch {self.epoch + 1}, step {batch + 1} "
                f"on rank {hvd.rank()}; lower --learning_rate or check the data, then "
                "resume from the last checkpoint (or keep going with --nan_policy=ignore)")
