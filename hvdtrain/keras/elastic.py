"""Horovod's `horovod.tensorflow.keras.elastic`, for Keras 3 (see hvdtrain.elastic)."""

from hvdtrain.elastic import (  # noqa: F401
    CommitStateCallback, KerasState, UpdateBatchStateCallback, UpdateEpochStateCallback,
    UpdatePositionStateCallback, run)


class TensorFlowKerasState(KerasState):
    """Horovod's base of KerasState; `backend` (a Keras 2 session holder) is
    accepted for compatibility: Keras 3 runs eagerly."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        super().__init__(model, optimizer, **kwargs)
