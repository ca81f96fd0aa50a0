"""Keras's ModelCheckpoint written by rank 0 only, atomically."""

import keras

from hvdtrain import runtime
from hvdtrain.state import atomic_files

__all__ = ["AtomicModelCheckpoint"]


class AtomicModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """keras.callbacks.ModelCheckpoint, with its arguments and meaning, for
    data-parallel training: only rank 0 writes, under a temporary name
    renamed into place, so a reader never sees half a file.

    Args:
        As for `keras.callbacks.ModelCheckpoint` (`filepath`, `monitor`,
        `save_best_only`, `save_weights_only`, `save_freq`, ...). On ranks
        other than 0 it writes nothing.
    """

    def _save_model(self, epoch, batch, logs):
        # Keras 3.15's own version (private API; Keras is pinned), writing atomically.
        if not runtime.is_main_process():
            return
        filepath = self._get_file_path(epoch, batch, logs)
        if self._should_save_model(epoch, batch, logs, filepath):
            atomic_files.save_model(self.model, filepath, weights_only=self.save_weights_only)
