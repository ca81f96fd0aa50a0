"""Early stopping that every rank decides alike, and a resumed run too."""

import keras
from absl import logging

from hvdtrain.callbacks.base import KeptState, monitor_mode, watched_value

__all__ = ["EarlyStopping"]


class EarlyStopping(KeptState, keras.callbacks.EarlyStopping):
    """Keras's EarlyStopping, on metrics averaged over the workers: put it
    after AverageMetrics and ExactEvaluation (callbacks.ORDER), and every
    rank sees the same values, stops after the same epoch and leaves no
    other waiting in a collective.

    Its count (epochs since the best value, the best value, where it
    stopped) is kept in checkpoints: a resumed run goes on counting where
    the interrupted one stood, and a run that stopped early stays stopped.

    Args:
        monitor: The metric watched (e.g. "val_loss").
        patience: Epochs without improvement after which training stops.
        min_delta: The least change that counts as an improvement.
        mode: "min" or "max": the direction in which the metric improves;
            "auto": the one it declares, as for the best checkpoint
            (callbacks.base.monitor_mode).
        state: A state from `get_state` to go on from; None: a new count.
    """

    state_key = "early_stopping"

    def __init__(self, monitor, patience, min_delta=0.0, mode="auto", state=None):
        super().__init__(monitor=monitor, patience=patience, min_delta=min_delta, mode=mode)
        self._restored = state
        self._started = False

    def on_train_begin(self, logs=None):
        # A run resumed mid-epoch fits twice: the count goes on across both.
        if self._started:
            return
        self._started = True
        super().on_train_begin(logs)
        if self._restored:
            self.set_state(self._restored)

    def _set_monitor_op(self):
        if self.mode == "auto":
            self.mode = monitor_mode(self.model, self.monitor)
        super()._set_monitor_op()

    def get_monitor_value(self, logs):
        return watched_value(logs, self.monitor)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.stopped_epoch == epoch and self.model.stop_training:
            logging.info("early stopping after epoch %d: %s has not improved for %d epoch(s) "
                         "(best %g after epoch %d)", epoch + 1, self.monitor, self.wait,
                         self.best, self.best_epoch + 1)

    @classmethod
    def stopped_after(cls, states):
        """The epoch (1-based) after which the run whose kept states are
        `states` ({state_key: state}) stopped early; None if it did not."""
        stopped = states.get(cls.state_key, {}).get("stopped_epoch", 0)
        return stopped + 1 if stopped else None   # Keras stops after an epoch > 0

    def get_state(self):
        return dict(wait=self.wait, best=None if self.best is None else float(self.best),
                    best_epoch=self.best_epoch, stopped_epoch=self.stopped_epoch)

    def set_state(self, state):
        self.wait, self.best = state["wait"], state["best"]
        self.best_epoch, self.stopped_epoch = state["best_epoch"], state["stopped_epoch"]
