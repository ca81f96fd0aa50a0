"""The base of hvdtrain's callbacks that need to know where training stands."""

import keras

__all__ = ["TrainingCallback"]


class TrainingCallback(keras.callbacks.Callback):
    """A callback that knows the epoch being trained and the global step.

    `epoch` is the current epoch (0-based, as Keras passes it). Steps are
    counted in whole epochs of `params["steps"]` batches, also in the rest
    of an epoch that a resumed run continues (fit.ContinuedEpoch shows it as
    the whole epoch). Subclasses that define `on_epoch_begin` call this
    one's.
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def global_step(self, batch):
        """Training steps done once `batch` (0-based, of the current epoch) ends."""
        return self.epoch * self.params["steps"] + batch + 1
