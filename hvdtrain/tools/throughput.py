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

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from absl import logging
from scipy import stats

__all__ = ["Measurement", "Rate", "describe", "log", "measure", "step_time_percentiles"]


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
        # A rate is never negative, whatever a few noisy windows suggest.
        return cls(mean, max(0.0, mean - half), mean + half, len(samples))

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


def measure(samples, name, window_steps, warmup_steps):
    """The Measurement of every rank's `samples` (windows' rates), a
    collective named after `name`; None without a window on some rank."""
    # Without Horovod (a plain Keras baseline) this process is all there is.
    size = hvd.size() if hvd.is_initialized() else 1
    windows = len(samples)
    if size > 1:
        # Steps are synchronous, so every rank has the same number of windows.
        windows = int(hvd.allreduce(tf.constant(windows), op=hvd.Min,
                                    name=f"hvdtrain.throughput.{name}.windows"))
    if windows == 0:
        return None
    samples = np.asarray(samples[:windows], np.float64)
    if size > 1:
        samples = hvd.allreduce(tf.constant(samples), op=hvd.Sum,
                                name=f"hvdtrain.throughput.{name}").numpy()
    total = Rate.of(samples)
    return Measurement(total, total.scaled(1 / size), size, window_steps,
                       warmup_steps)


def step_time_percentiles(seconds):
    """{p50, p90, p99, max} of step times in seconds (None without any)."""
    if not seconds:
        return None
    p50, p90, p99 = np.percentile(seconds, [50, 90, 99])
    return dict(p50=float(p50), p90=float(p90), p99=float(p99), max=float(max(seconds)))


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
