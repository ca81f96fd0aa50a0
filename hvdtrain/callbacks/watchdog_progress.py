"""Training's progress, as the run's watchdog sees it."""

from hvdtrain.callbacks.base import TrainingCallback
from hvdtrain.faults import watchdog

__all__ = ["WatchdogProgress"]


class WatchdogProgress(TrainingCallback):
    """Marks each training and evaluation batch and epoch as progress, so
    that the watchdog names where a hung rank stopped."""

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        watchdog.progress(f"training epoch {epoch + 1}, step 1")

    def on_train_batch_end(self, batch, logs=None):
        watchdog.progress(f"training epoch {self.epoch + 1}, step {batch + 2}")

    def on_test_begin(self, logs=None):
        watchdog.progress(f"evaluating after epoch {self.epoch + 1}")

    def on_test_batch_end(self, batch, logs=None):
        watchdog.progress()

    def on_epoch_end(self, epoch, logs=None):
        watchdog.progress(f"ending epoch {epoch + 1}")

    def on_train_end(self, logs=None):
        watchdog.progress("ending training")
