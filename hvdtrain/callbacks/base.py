"""What hvdtrain's callbacks share: the epoch and global step, the direction
a watched metric improves in, and state that checkpoints keep."""

import keras

from hvdtrain.errors import UsageError

__all__ = ["CallSteps", "KeptState", "TrainingCallback", "kept_states", "monitor_mode",
           "watched_value"]


class TrainingCallback(keras.callbacks.Callback):
    """A callback that knows the epoch being trained and the global step.

    `epoch` is the current epoch (0-based, as Keras passes it). Steps are
    counted in whole epochs of `params["steps"]` batches, also in the rest
    of an epoch that a resumed run continues (fit.EpochSteps shows it as
    the whole epoch). Subclasses that define `on_epoch_begin` call this
    one's.
    """

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def global_step(self, batch):
        """Training steps done once `batch` (0-based, of the current epoch) ends."""
        return self.epoch * self.params["steps"] + batch + 1


class CallSteps:
    """For a callback that counts steps: a batch's hooks bracket one call of
    the train function, which runs several steps with steps_per_execution
    (hvdtrain.run.executions), `batch` being the call's first step at its
    begin and its last at its end. Put it before the callback's base class;
    a subclass that defines `on_train_batch_begin` calls this one's."""

    call_first = 0   # the first step of the call under way

    def on_train_batch_begin(self, batch, logs=None):
        self.call_first = batch

    def call_steps(self, batch):
        """The steps of the call that ended at step `batch`."""
        return batch - self.call_first + 1


class KeptState:
    """A callback whose decisions depend on the epochs before (counters, the
    best value so far): checkpoints and elastic commits keep its state, so
    that a resumed run decides as the uninterrupted one would.

    Subclasses set `state_key`, the name the state is kept under, and
    define `get_state()`, a dict of JSON values, and `set_state(state)`.
    The state changes only at epochs' ends.
    """

    state_key = None

    def get_state(self):
        raise NotImplementedError

    def set_state(self, state):
        raise NotImplementedError


def kept_states(callbacks):
    """{state_key: state} of the `KeptState` callbacks among `callbacks`."""
    return {c.state_key: c.get_state() for c in callbacks if isinstance(c, KeptState)}


def monitor_mode(model, monitor):
    """"min" or "max": whether a smaller or a larger `monitor` is better.

    The direction its metric declares, as Keras's MonitorCallback reads it
    (`val_` names the same metric on the validation split); the loss is
    minimised. A name no metric of `model` has falls back to its words:
    losses and errors ("loss", "error", "mse", "mae") are minimised.
    """
    name = monitor.removeprefix("val_")
    if name == "loss":
        return "min"
    for metric in _metrics(model):
        if metric.name == name and hasattr(metric, "_direction"):  # Keras's own attribute
            return "max" if metric._direction == "up" else "min"
    return "min" if any(word in monitor for word in ("loss", "error", "mse", "mae")) else "max"


def watched_value(logs, monitor):
    """The value of the watched metric `monitor` in an epoch's `logs`.

    Raises:
        UsageError: If the epoch has no such metric (a misspelt
            --best_metric), naming those it has: a decision that never sees
            its metric would silently never be taken. Every rank has the
            same metrics, so all raise at the same epoch's end.
    """
    logs = logs or {}
    if monitor not in logs:
        raise UsageError(f"--best_metric={monitor} is not a metric of this run; it has "
                         f"{', '.join(sorted(logs))}")
    return logs[monitor]


def _metrics(model):
    """The model's metric objects, those compile() groups included."""
    for metric in model.metrics:
        yield metric
        yield from getattr(metric, "metrics", ())
