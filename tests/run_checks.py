"""Checks of a finished run, for tests of every tier: its status, its
checkpoints, its model and its summary line."""

import re

import keras

from hvdtrain.state import checkpoint


def ok(result):
    """A finished process's output, once it exited 0."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def weights(model_dir):
    return keras.saving.load_model(model_dir / "model.keras").get_weights()


def all_intact(model_dir):
    """The names of the run's checkpoints, newest first, each read whole."""
    paths = checkpoint.listed(model_dir / "checkpoints")
    for path in paths:
        checkpoint.read(path)  # raises if damaged
    return [p.name for p in paths]


def final_accuracy(output):
    """The last epoch's val_accuracy in a run's summary."""
    return float(re.search(r"val_accuracy (\d\.\d+)", output).group(1))
