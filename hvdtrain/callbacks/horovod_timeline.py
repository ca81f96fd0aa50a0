"""Horovod's timeline recorded over a window of global steps."""

import os

import horovod.tensorflow as hvd
from absl import logging

from hvdtrain import runtime
from hvdtrain.callbacks.step_window import StepWindow

__all__ = ["HorovodTimeline"]


class HorovodTimeline(StepWindow):
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
        super().__init__(first, last)
        self.path = os.fspath(path)

    def start_recording(self):
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        hvd.start_timeline(self.path, mark_cycles=True)

    def stop_recording(self):
        hvd.stop_timeline()
        if runtime.is_main_process():
            logging.info("Horovod timeline of steps %d-%d written to %s (open it in "
                         "chrome://tracing or ui.perfetto.dev)", self.first, self.last, self.path)
