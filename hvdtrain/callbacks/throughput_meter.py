"""Training throughput timed in windows of steps (the method: hvdtrain.tools.throughput)."""

import time

import keras

from hvdtrain.callbacks.base import CallSteps
from hvdtrain.tools import throughput

__all__ = ["Throughput"]


class Throughput(CallSteps, keras.callbacks.Callback):
    """Times windows of `window_steps` training steps of `batch_size`
    examples per worker after the first `warmup_steps` of each fit. Give it
    to every rank, first among the callbacks. With several steps per call
    of the train function the calls are timed: warm-up and windows end at
    the first call's end that reaches their steps.

    At each epoch's end (a collective) it adds the epoch's total rate to the
    logs as `examples_per_second`, for the progress line, the history and
    TensorBoard, and keeps the epoch's measurement and this rank's step
    times. At each fit's end (a collective) it keeps the run's measurement
    so far in `run_measurement`, and in `seconds` the time since the first
    fit began. A measurement is None when there were too few steps for one
    window.

    Args:
        batch_size: Examples per step on each worker.
        warmup_steps: Training steps at the start of each fit left out
            (tracing, tf.data's autotuning, Horovod's caches filling up).
        window_steps: Training steps per timed window; each window gives one
            rate sample, and a window an epoch's end cuts short is dropped.
    """

    def __init__(self, batch_size, warmup_steps=10, window_steps=10):
        super().__init__()
        self.batch_size = batch_size
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.samples = []
        self.epoch_measurement = None
        self.run_measurement = None
        self.epoch_step_seconds = []   # this rank's timed steps of the last epoch (of each call)
        self.seconds = 0.0
        self._first_begin = None
        self._epoch_first_sample = 0
        self._steps_this_fit = 0
        self._window_start = None
        self._window_steps_done = 0
        self._step_start = None

    def on_train_begin(self, logs=None):
        self._steps_this_fit = 0
        if self._first_begin is None:
            self._first_begin = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self._window_start = None  # a window left open at an epoch's end is dropped
        self._epoch_first_sample = len(self.samples)
        self.epoch_step_seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self._steps_this_fit < self.warmup_steps:
            return
        self._step_start = time.perf_counter()
        if self._window_start is None:
            self._window_start, self._window_steps_done = self._step_start, 0

    def on_train_batch_end(self, batch, logs=None):
        steps = self.call_steps(batch)
        self._steps_this_fit += steps
        if self._window_start is None:
            return
        loss = (logs or {}).get("loss")
        if loss is not None:
            float(loss)  # waits for the step to finish where it runs asynchronously (GPUs)
        now = time.perf_counter()
        self.epoch_step_seconds.extend([(now - self._step_start) / steps] * steps)
        self._window_steps_done += steps
        if self._window_steps_done >= self.window_steps:
            self.samples.append(
                self._window_steps_done * self.batch_size / (now - self._window_start))
            self._window_start = None

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_measurement = self._measure(self.samples[self._epoch_first_sample:],
                                               "epoch")
        if self.epoch_measurement is not None and logs is not None:
            logs["examples_per_second"] = self.epoch_measurement.total.mean

    def on_train_end(self, logs=None):
        self.run_measurement = self.measurement()
        self.seconds = time.perf_counter() - self._first_begin

    def measurement(self):
        """The run's throughput, reduced over the ranks (a collective)."""
        return self._measure(self.samples, "run")

    def _measure(self, samples, name):
        return throughput.measure(samples, name, self.window_steps, self.warmup_steps)
