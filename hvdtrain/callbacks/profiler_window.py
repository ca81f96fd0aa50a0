"""TensorFlow's profiler recorded over a window of global steps."""

import os

import tensorflow as tf
from absl import logging

from hvdtrain.callbacks.step_window import StepWindow

__all__ = ["ProfilerWindow"]


class ProfilerWindow(StepWindow):
    """Records TensorFlow's profiler over global training steps `first` to
    `last` (1-based, inclusive) into `log_dir`, for TensorBoard's profile tab
    (`log_dir/plugins/profile/<run>/`), each step marked as one in the trace.
    Give it to rank 0 only: every process would write its own trace.

    The profiler runs during those steps only: the others run as they would
    without it. As Keras's TensorBoard callback does, it is started and
    stopped once at the start, so that its own start-up is not in the window.

    Args:
        log_dir: The TensorBoard run directory the trace goes to.
        first: The first global training step recorded (1-based).
        last: The last global training step recorded (inclusive); recording
            also stops when training ends before it.
    """

    def __init__(self, log_dir, first, last):
        super().__init__(first, last)
        self.log_dir = os.fspath(log_dir)
        self._step = None
        self._warmed_up = False

    def on_train_begin(self, logs=None):
        if not self._warmed_up:
            self._warmed_up = True
            tf.profiler.experimental.start(self.log_dir)
            tf.profiler.experimental.stop(save=False)

    def start_recording(self):
        tf.profiler.experimental.start(self.log_dir)

    def step_begins(self, step):
        # A call of several steps is one step of the trace; `_r=1` marks it
        # as a step: the profile's step-time analysis counts it.
        self._step = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
        self._step.__enter__()

    def step_ends(self):
        self._step.__exit__(None, None, None)
        self._step = None

    def stop_recording(self):
        tf.profiler.experimental.stop()
        logging.info("TensorFlow profile of steps %d-%d written to %s (TensorBoard's profile "
                     "tab: tensorboard --logdir %s)", self.first, self.last, self.log_dir,
                     os.path.dirname(self.log_dir))
