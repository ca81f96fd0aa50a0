"""Horovod's `horovod.tensorflow.keras.callbacks` for Keras 3: Horovod's
names and signatures over hvdtrain's callbacks. `device` arguments are
accepted and ignored: the collectives place their own tensors."""

import os

from hvdtrain import callbacks
from hvdtrain.errors import UsageError

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]


class BroadcastGlobalVariablesCallback(callbacks.BroadcastInitialState):
    """Horovod's name for hvdtrain.callbacks.BroadcastInitialState.

    Args:
        root_rank: The rank whose state every rank takes.
        device: Ignored.
        local_variables: Variables that keep their own value on each rank.
    """

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__(root_rank, local_variables=local_variables)


class MetricAverageCallback(callbacks.AverageMetrics):
    """Horovod's name for hvdtrain.callbacks.AverageMetrics.

    Args:
        device: Ignored.
    """

    def __init__(self, device=""):
        super().__init__()


class _CurrentEpoch:
    """Horovod's learning-rate callbacks' `current_epoch` attribute."""

    @property
    def current_epoch(self):
        """The epoch being trained."""
        return self.epoch


class LearningRateScheduleCallback(_CurrentEpoch, callbacks.ScheduledLearningRate):
    """Horovod's name for hvdtrain.callbacks.ScheduledLearningRate, with the
    same arguments."""


class LearningRateWarmupCallback(_CurrentEpoch, callbacks.LearningRateWarmup):
    """Horovod's name for hvdtrain.callbacks.LearningRateWarmup, with the
    same arguments."""


class BestModelCheckpoint(callbacks.AtomicModelCheckpoint):
    """Horovod's `BestModelCheckpoint`: a ModelCheckpoint with
    `save_best_only=True` whose `filepath` may be given later (set the
    attribute before training). Only rank 0 writes, atomically.

    Args:
        monitor, verbose, save_weights_only, mode, save_freq: As in
            keras.callbacks.ModelCheckpoint.
        filepath: Where to write; None: set `filepath` before training.

    Raises:
        UsageError: training starts with no `filepath`.
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        # Keras checks the suffix now; a path given later is checked when saving.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only,
                         mode=mode, save_freq=save_freq)
        self.filepath = os.fspath(filepath) if filepath is not None else None

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise UsageError("BestModelCheckpoint: set its filepath before training")
        super().on_train_begin(logs)
