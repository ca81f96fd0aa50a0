"""Rank 0's files: written under a temporary name, then renamed, so a reader
(or a resumed run) sees a complete file or none."""

import os
import pathlib

import keras


def save_model(model, path, weights_only=False):
    """Saves `model` at `path` (`.keras`, or `.weights.h5` with
    `weights_only`), atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keras insists on the suffixes, so the temporary name ends with the name.
    tmp = path.with_name(f".tmp.{os.getpid()}.{path.name}")
    try:
        if weights_only:
            model.save_weights(tmp)
        else:
            model.save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (weights and optimizer state) at each epoch's end.
    Give it to rank 0 only."""

    def __init__(self, path):
        super().__init__()
        self.path = pathlib.Path(path)

    def on_epoch_end(self, epoch, logs=None):
        save_model(self.model, self.path)
