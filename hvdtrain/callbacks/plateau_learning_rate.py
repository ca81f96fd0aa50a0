"""The learning rate lowered when a metric stops improving
(--lr_schedule=plateau)."""

import keras
from absl import logging

from hvdtrain.callbacks.base import KeptState, TrainingCallback, monitor_mode, watched_value
from hvdtrain.errors import UsageError
from hvdtrain.parallel.data_parallel.optimizer import step_rate

__all__ = ["PlateauLearningRate"]


class PlateauLearningRate(KeptState, TrainingCallback):
    """After warm-up, the rate times `factor` for each time `monitor` has
    not improved for `patience` epochs, as Keras's ReduceLROnPlateau decides
    it (min_delta, cooldown), on metrics averaged over the workers (put it
    after AverageMetrics and ExactEvaluation: callbacks.ORDER), so that
    every rank lowers its rate at the same epoch.

    Unlike Keras's callback it counts the lowerings and has the train step's
    rate (hvdtrain.run.learning_rate.TrainingRate) multiplied by
    `factor ** lowerings`: set at every step with momentum correction, from
    the rate scaled for the workers there are (a run resumed on another
    number of workers keeps its lowerings). The count, and Keras's own
    state, are kept in checkpoints.

    Args:
        monitor: The metric watched (e.g. "val_loss").
        factor: What each lowering multiplies the rate by, in (0, 1).
        patience: Epochs without improvement before a lowering.
        warmup_epochs: Epochs of warm-up; the epochs that begin after it count.
        min_delta: The least change that counts as an improvement.
        mode: "min", "max", or "auto" (the direction the metric declares:
            callbacks.base.monitor_mode).
        state: A state from `get_state` to go on from; None: none lowered yet.
    """

    state_key = "plateau"

    def __init__(self, monitor, factor, patience, warmup_epochs, min_delta=1e-4, mode="auto",
                 state=None):
        super().__init__()
        self.factor = factor
        self.warmup_epochs = warmup_epochs
        self.lowerings = 0
        self._judge = _CountLowerings(self, monitor=monitor, factor=factor, patience=patience,
                                      min_delta=min_delta, mode=mode)
        self._restored = state
        self._started = False

    def set_model(self, model):
        super().set_model(model)
        self._judge.set_model(model)

    def on_train_begin(self, logs=None):
        # A run resumed mid-epoch fits twice: the count goes on across both.
        if self._started:
            return
        self._started = True
        self._judge.on_train_begin(logs)
        if self._restored:
            self.set_state(self._restored)
        self._lower()

    def on_epoch_end(self, epoch, logs=None):
        watched_value(logs, self._judge.monitor)
        if epoch >= self.warmup_epochs:
            self._judge.on_epoch_end(epoch, logs)
            self._lower()

    def get_state(self):
        judge = self._judge
        return dict(lowerings=self.lowerings, wait=judge.wait,
                    best=None if judge.best is None else float(judge.best),
                    cooldown_counter=judge.cooldown_counter)

    def set_state(self, state):
        self.lowerings = state["lowerings"]
        self._judge.wait, self._judge.best = state["wait"], state["best"]
        self._judge.cooldown_counter = state["cooldown_counter"]

    def _lower(self):
        rate = step_rate(self.model.optimizer)
        if rate is None:
            raise UsageError("PlateauLearningRate lowers the rate hvdtrain train sets in its "
                             "train step; in your own script use "
                             "keras.callbacks.ReduceLROnPlateau after AverageMetrics")
        rate.schedule.lower(self.factor ** self.lowerings)


class _CountLowerings(keras.callbacks.ReduceLROnPlateau):
    """Keras's decision when to lower the rate; the lowering itself is
    counted in `owner`, which sets the rate."""

    def __init__(self, owner, **kwargs):
        super().__init__(**kwargs)
        self.owner = owner

    def _set_monitor_op(self):
        if self.mode == "auto":
            self.mode = monitor_mode(self.model, self.monitor)
        super()._set_monitor_op()

    def _reduce_optimizer_lr(self, optimizer, epoch, name=""):
        self.owner.lowerings += 1
        logging.info("epoch %d: %s has not improved for %d epoch(s): learning rate x %g "
                     "(lowered %d time(s))", epoch + 1, self.monitor, self.wait, self.factor,
                     self.owner.lowerings)
        return True
