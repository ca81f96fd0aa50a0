"""Training throughput as a benchmark would report it, for every run.

The first steps of a fit are left out (tracing, tf.data's autotuning,
Horovod's tensor-fusion and response caches filling up). After them, each
window of consecutive steps inside one epoch is one sample: examples over
seconds, timed from the end of the step before the window to the end of its
last step, so epoch-end work (validation, checkpoints) is never in a sample.
Every rank times its own windows; since steps are synchronous they have the
same windows, and the total of a window is the sum of the ranks' rates. The
report is the mean over windows with a 95% confidence interval of that mean
(Student's t), per worker and in total, where Horovod's synthetic benchmark
prints 1.96 standard deviations of the samples and rank 0's rate times the
workers.
"""

import dataclasses
import math
import time

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from absl import logging
from scipy import stats


@dataclasses.dataclass(frozen=True)
class Rate:
    """Examples per second: the mean of `windows` samples and its 95% interval."""
    mean: float
    low: float
    high: float
    windows: int

    @classmethod
    def of(cls, samples):
        samples = np.asarray(samples, np.float64)
        mean = float(samples.mean())
        if len(samples) < 2:
            return cls(mean, math.nan, math.nan, len(samples))
        half = float(stats.t.ppf(0.975, len(samples) - 1) * stats.sem(samples))
        return cls(mean, mean - half, mean + half, len(samples))

    def scaled(self, factor):
        return Rate(self.mean * factor, self.low * factor, self.high * factor, self.windows)

    def describe(self, unit):
        if math.isnan(self.low):
            return f"{self.mean:.1f} {unit}/s"
        return f"{self.mean:.1f} {unit}/s (95% interval {self.low:.1f}-{self.high:.1f})"


@dataclasses.dataclass(frozen=True)
class Measurement:
    total: Rate         # all workers together
    per_worker: Rate
    workers: int
    window_steps: int
    warmup_steps: int   # left out at the start of each fit


class Throughput(keras.callbacks.Callback):
    """Times windows of `window_steps` training steps of `batch_size`
    examples per worker after the first `warmup_steps` of each fit. Give it
    to every rank; `measurement()` (collective: call it on every rank) gives
    the result, None if the run was too short for one window."""

    def __init__(self, batch_size, warmup_steps=10, window_steps=10):
        super().__init__()
        self.batch_size = batch_size
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.samples = []
        self._steps_this_fit = 0
        self._window_start = None
        self._window_steps_done = 0

    def on_train_begin(self, logs=None):
        self._steps_this_fit = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._window_start = None  # a window left open at an epoch's end is dropped

    def on_train_batch_begin(self, batch, logs=None):
        if self._window_start is None and self._steps_this_fit >= self.warmup_steps:
            self._window_start, self._window_steps_done = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps_this_fit += 1
        if self._window_start is None:
            return
        loss = (logs or {}).get("loss")
        if loss is not None:
            float(loss)  # waits for the step to finish where it runs asynchronously (GPUs)
        self._window_steps_done += 1
        if self._window_steps_done == self.window_steps:
            seconds = time.perf_counter() - self._window_start
            self.samples.append(self.window_steps * self.batch_size / seconds)
            self._window_start = None

    def measurement(self):
        """The run's throughput, reduced over the ranks (a collective)."""
        windows = len(self.samples)
        if hvd.size() > 1:
            # Steps are synchronous, so every rank has the same number of windows.
            windows = int(hvd.allreduce(tf.constant(windows), op=hvd.Min,
                                        name="hvdtrain.throughput.windows"))
        if windows == 0:
            return None
        samples = np.asarray(self.samples[:windows], np.float64)
        if hvd.size() > 1:
            samples = hvd.allreduce(tf.constant(samples), op=hvd.Sum,
                                    name="hvdtrain.throughput").numpy()
        total = Rate.of(samples)
        return Measurement(total, total.scaled(1 / hvd.size()), hvd.size(), self.window_steps,
                           self.warmup_steps)


def describe(measurement, unit="examples"):
    """One line for people: the rates, and what they were measured over."""
    workers = measurement.workers
    return (f"{measurement.total.describe(unit)} on {workers} worker{'s' * (workers != 1)}, "
            f"{measurement.per_worker.describe(unit)} per worker; {measurement.total.windows} "
            f"windows of {measurement.window_steps} steps after "
            f"{measurement.warmup_steps} warm-up steps")


def log(measurement, unit="examples"):
    if measurement is None:
        logging.info("throughput: the run was too short to time a window of steps after "
                     "warm-up (lower --throughput_warmup_steps or --throughput_window_steps)")
    else:
        logging.info("throughput: %s", describe(measurement, unit))
