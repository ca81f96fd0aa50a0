"""Horovod's timeline recorded over a window of global steps."""

import os

import horovod.tensorflow as hvd
from absl import logging

from hvdtrain import runtime
from hvdtrain.callbacks.base import TrainingCallback

__all__ = ["HorovodTimeline"]


class HorovodTimeline(TrainingCallback):
    """Records Horovod's timeline (negotiation, fusion and each collective,
    for every rank) over global training steps `first` to `last`
    (1-based, inclusive; with several steps per call of the train function,
    the calls that hold them) into `path`, which rank 0 writes; view it in
    chrome://tracing or ui.perfetto.dev. Needs runtime.init(timeline=True).

    Args:
        path: The timeline's JSON file; its directory is created if missing.
        first: The first global training step recorded (1-based).
        last: The last global training step recorded (inclusive); recording
            also stops when training ends before it.
    """

    def __init__(self, path, first, last):
        super().__init__()
        self.path = os.fspath(path)
        self.first, self.last = first, last
        self._recording = False

    def on_train_batch_begin(self, batch, logs=None):
        # A call of several steps is recorded whole when the window reaches into it.
        first_step = self.global_step(batch)
        if (not self._recording and first_step <= self.last
                and first_step + self.model.steps_per_execution > self.first):
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            hvd.start_timeline(self.path, mark_cycles=True)
            self._recording = True

    def on_train_batch_end(self, batch, logs=None):
        if self._recording and self.global_step(batch) >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        if self._recording:
            self._stop()

    def _stop(self):
        hvd.stop_timeline()
        self._recording = False
        if runtime.is_main_process():
            logging.info("Horovod timeline of steps %d-%d written to %s (open it in "
                         "chrome://tracing or ui.perfetto.dev)", self.first, self.last, self.path)
