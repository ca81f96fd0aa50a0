"""Horovod's `horovod.tensorflow.keras.callbacks`, for Keras 3 (see hvdtrain.callbacks)."""

from hvdtrain.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
    LearningRateWarmupCallback, MetricAverageCallback)
