"""hvdtrain's Keras 3 callbacks for data-parallel training, one per module.

`order.ORDER` is the order `hvdtrain train` runs them in. Horovod's
callbacks, by Horovod's names, are in hvdtrain.keras.callbacks. They depend
on state, parallel, faults and tools; run and users' scripts depend on them.
"""

from hvdtrain.callbacks.atomic_model_checkpoint import AtomicModelCheckpoint
from hvdtrain.callbacks.average_metrics import AverageMetrics
from hvdtrain.callbacks.average_weights_for_evaluation import AverageWeightsForEvaluation
from hvdtrain.callbacks.base import KeptState, TrainingCallback, kept_states
from hvdtrain.callbacks.broadcast_initial_state import BroadcastInitialState
from hvdtrain.callbacks.commit_state import CommitState
from hvdtrain.callbacks.early_stopping import EarlyStopping
from hvdtrain.callbacks.epoch_tensorboard import EpochTensorBoard
from hvdtrain.callbacks.exact_evaluation import ExactEvaluation
from hvdtrain.callbacks.fail_on_non_finite_loss import FailOnNonFiniteLoss
from hvdtrain.callbacks.horovod_timeline import HorovodTimeline
from hvdtrain.callbacks.learning_rate_log import LearningRateLog
from hvdtrain.callbacks.learning_rate_schedule import ScheduledLearningRate
from hvdtrain.callbacks.learning_rate_warmup import LearningRateWarmup
from hvdtrain.callbacks.order import ORDER, in_order
from hvdtrain.callbacks.periodic_checkpoint import PeriodicCheckpoint
from hvdtrain.callbacks.plateau_learning_rate import PlateauLearningRate
from hvdtrain.callbacks.preemption_stop import PreemptionStop, StopVote
from hvdtrain.callbacks.profiler_window import ProfilerWindow
from hvdtrain.callbacks.run_log_writer import RunLog
from hvdtrain.callbacks.throughput_meter import Throughput
from hvdtrain.callbacks.track_position import TrackPosition
from hvdtrain.callbacks.watchdog_progress import WatchdogProgress

__all__ = [
    "AtomicModelCheckpoint", "AverageMetrics", "AverageWeightsForEvaluation",
    "BroadcastInitialState", "CommitState", "EarlyStopping", "EpochTensorBoard",
    "ExactEvaluation", "FailOnNonFiniteLoss", "HorovodTimeline", "KeptState",
    "LearningRateLog", "LearningRateWarmup", "ORDER", "PeriodicCheckpoint", "PlateauLearningRate",
    "PreemptionStop", "ProfilerWindow", "RunLog", "ScheduledLearningRate", "StopVote",
    "Throughput", "TrackPosition", "TrainingCallback", "WatchdogProgress",
    "in_order", "kept_states",
]
