"""The trained model, for users and for serving, written by rank 0:
MODEL_DIR/model.keras (Keras's format: architecture, weights, optimizer) and
MODEL_DIR/saved_model (a TensorFlow SavedModel whose `serve` signature runs
the model in inference mode, for TF Serving and tf.saved_model.load).
Each appears complete or not at all."""

import os
import pathlib
import shutil

from absl import logging

from hvdtrain.state import atomic_files

__all__ = ["KERAS_FILE", "SAVED_MODEL_DIR", "export"]

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


def export(model, model_dir):
    """Writes both formats under `model_dir`; returns their paths."""
    model_dir = pathlib.Path(model_dir)
    keras_path = atomic_files.save_model(model, model_dir / KERAS_FILE)
    saved_model = model_dir / SAVED_MODEL_DIR
    temporary = atomic_files.temporary_path(saved_model)
    replaced = atomic_files.temporary_path(model_dir / f"old.{SAVED_MODEL_DIR}")
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.WARNING)  # TensorFlow's notes on tracing and saving
    try:
        model.export(temporary, format="tf_saved_model", verbose=False)
        if saved_model.exists():
            os.rename(saved_model, replaced)
        os.rename(temporary, saved_model)
    finally:
        logging.set_verbosity(verbosity)
        shutil.rmtree(temporary, ignore_errors=True)
        shutil.rmtree(replaced, ignore_errors=True)
    return keras_path, saved_model
