"""The throughput meter's windows, warm-up and interval, on a clock the test drives."""

import math

import numpy as np
import pytest
from scipy import stats

import hvdtrain
from hvdtrain.callbacks import throughput_meter
from hvdtrain.tools import throughput


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _train(meter, clock, step_seconds, epochs):
    """Drives `meter` through `epochs` epochs whose steps take the given
    seconds each; epoch-end work takes a minute."""
    meter.on_train_begin()
    for _ in range(epochs):
        meter.on_epoch_begin(0)
        for batch, seconds in enumerate(step_seconds):
            meter.on_train_batch_begin(batch)
            clock.now += seconds
            meter.on_train_batch_end(batch, {"loss": 1.0})
        clock.now += 60.0


def test_warmup_and_epoch_ends_are_left_out(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(throughput_meter.time, "perf_counter", clock)
    meter = throughput_meter.Throughput(batch_size=8, warmup_steps=2, window_steps=2)
    # Slow first steps (tracing) and a partial window at each epoch's end.
    _train(meter, clock, [5.0, 3.0, 0.5, 0.5, 0.25, 0.25, 1.0], epochs=2)
    # Epoch 1: windows [2,3] and [4,5], step 6 dropped. Epoch 2 (no warm-up
    # again in the same fit): [0,1], [2,3], [4,5].
    assert meter.samples == pytest.approx([16, 32, 16 / 8, 16, 32])
    measured = meter.measurement()
    assert measured.workers == 1 and measured.total.windows == 5
    assert measured.per_worker == measured.total


def test_a_new_fit_warms_up_again(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(throughput_meter.time, "perf_counter", clock)
    meter = throughput_meter.Throughput(batch_size=1, warmup_steps=1, window_steps=1)
    _train(meter, clock, [9.0, 1.0], epochs=1)
    _train(meter, clock, [9.0, 0.5], epochs=1)
    assert meter.samples == pytest.approx([1.0, 2.0])


def test_the_interval_is_students_t_of_the_mean():
    samples = [100.0, 104.0, 98.0, 101.0, 97.0]
    rate = throughput.Rate.of(samples)
    half = stats.t.ppf(0.975, 4) * np.std(samples, ddof=1) / math.sqrt(5)
    assert rate.mean == pytest.approx(100.0)
    assert (rate.low, rate.high) == pytest.approx((100.0 - half, 100.0 + half))
    assert rate.describe("images") == (
        f"100.0 images/s (95% interval {100 - half:.1f}-{100 + half:.1f})")
    assert throughput.Rate.of([50.0]).describe("images") == "50.0 images/s"


def test_too_short_a_run_measures_nothing(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(throughput_meter.time, "perf_counter", clock)
    meter = throughput_meter.Throughput(batch_size=8, warmup_steps=10, window_steps=10)
    _train(meter, clock, [0.1] * 15, epochs=1)
    assert meter.samples == [] and meter.measurement() is None


def test_the_interval_stops_at_zero():
    rate = throughput.Rate.of([1.0, 30.0])
    assert rate.low == 0.0 and rate.high > 30.0
