"""A recorder over a window of global training steps: what the Horovod
timeline and TensorFlow's profiler windows share."""

from hvdtrain.callbacks.base import TrainingCallback

__all__ = ["StepWindow"]


class StepWindow(TrainingCallback):
    """Records over global training steps `first` to `last` (1-based,
    inclusive; with several steps per call of the train function, the calls
    that hold them, whole). A subclass says how: `start_recording` and
    `stop_recording`, and `step_begins`/`step_ends` around each call
    recorded.

    Args:
        first: The first global training step recorded (1-based).
        last: The last global training step recorded (inclusive); recording
            also stops when training ends before it.
    """

    def __init__(self, first, last):
        super().__init__()
        self.first, self.last = first, last
        self._recording = False

    def start_recording(self):
        raise NotImplementedError

    def stop_recording(self):
        raise NotImplementedError

    def step_begins(self, step):
        """Before a call recorded, whose first global step is `step`."""

    def step_ends(self):
        """After a call recorded."""

    def on_train_batch_begin(self, batch, logs=None):
        step = self.global_step(batch)
        # A call of several steps is recorded whole when the window reaches into it.
        if not (step <= self.last and step + self.model.steps_per_execution > self.first):
            return
        if not self._recording:
            self.start_recording()
            self._recording = True
        self.step_begins(step)

    def on_train_batch_end(self, batch, logs=None):
        if not self._recording:
            return
        self.step_ends()
        if self.global_step(batch) >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        if self._recording:
            self._stop()

    def _stop(self):
        self.stop_recording()
        self._recording = False
