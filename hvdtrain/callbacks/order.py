"""The one order hvdtrain's callbacks run in, and why.

Keras runs callbacks in list order, hook by hook: at an epoch's end the
metrics must be averaged before anything reads them (early stopping and the
plateau schedule decide on them: every rank alike), a checkpoint must come
after the decisions whose state it keeps, and an elastic commit after the
checkpoint it should cover.
"""

from hvdtrain.callbacks.average_metrics import AverageMetrics
from hvdtrain.callbacks.average_weights_for_evaluation import AverageWeightsForEvaluation
from hvdtrain.callbacks.broadcast_initial_state import BroadcastInitialState
from hvdtrain.callbacks.commit_state import CommitState
from hvdtrain.callbacks.early_stopping import EarlyStopping
from hvdtrain.callbacks.epoch_tensorboard import EpochTensorBoard
from hvdtrain.callbacks.exact_evaluation import ExactEvaluation
from hvdtrain.callbacks.fail_on_non_finite_loss import FailOnNonFiniteLoss
from hvdtrain.callbacks.horovod_timeline import HorovodTimeline
from hvdtrain.callbacks.learning_rate_log import LearningRateLog
from hvdtrain.callbacks.periodic_checkpoint import PeriodicCheckpoint
from hvdtrain.callbacks.plateau_learning_rate import PlateauLearningRate
from hvdtrain.callbacks.preemption_stop import PreemptionStop
from hvdtrain.callbacks.profiler_window import ProfilerWindow
from hvdtrain.callbacks.run_log_writer import RunLog
from hvdtrain.callbacks.throughput_meter import Throughput
from hvdtrain.callbacks.track_position import TrackPosition
from hvdtrain.callbacks.watchdog_progress import WatchdogProgress

__all__ = ["ORDER", "in_order"]

ORDER = (
    Throughput,             # first: its timing leaves out the others' work between steps
    WatchdogProgress,
    BroadcastInitialState,
    AverageWeightsForEvaluation,   # validation on the moving averages, ...
    ExactEvaluation,        # ... its metrics exact over the whole split, ...
    AverageMetrics,         # ... training metrics: averaged, before everything that reads them
    FailOnNonFiniteLoss,
    LearningRateLog,        # the rate the epoch ended at, beside its metrics
    PlateauLearningRate,    # lowers the rate for the next epochs
    EarlyStopping,
    PeriodicCheckpoint,     # writes the averaged metric it monitors, and the decisions' state
    RunLog,                 # records the averaged metrics and the meter's epoch
    EpochTensorBoard,
    HorovodTimeline,
    ProfilerWindow,
    PreemptionStop,         # after the epoch's checkpoint and records, which it ends with
    TrackPosition,          # last: an epoch's end is committed after the work done
    CommitState,            # there (checkpoint), with the position just tracked
)


def in_order(callbacks):
    """`callbacks` in ORDER's order, each placed by the first of ORDER's
    classes it is an instance of (a subclass stands where its base does).

    Raises:
        ValueError: a callback is an instance of none of ORDER's classes.
    """
    def place(callback):
        for index, cls in enumerate(ORDER):
            if isinstance(callback, cls):
                return index
        raise ValueError(f"{type(callback).__name__} has no place in callbacks.ORDER")

    return sorted(callbacks, key=place)
