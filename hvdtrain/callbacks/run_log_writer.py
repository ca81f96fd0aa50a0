"""Rank 0's records of a run in its JSON-lines log (the format: hvdtrain.tools.run_log)."""

import dataclasses
import datetime
import json
import math
import platform

import keras

from hvdtrain import runtime
from hvdtrain.tools import run_log, throughput

__all__ = ["RunLog"]


class RunLog(keras.callbacks.Callback):
    """Appends the records of one start of training to `directory/log.jsonl`
    on rank 0: `start` when its first fit begins (a start that is not
    `resumed` begins a new log), `epoch` at each epoch's end, `end` when
    the fit that reaches `config.epochs` ends. Give it to every rank, after
    `meter`: the run's throughput is `meter`'s.

    Args:
        directory: The run's model directory.
        meter: The run's callbacks.Throughput.
        config: The run's TrainConfig, recorded with the start.
        start: (epoch, step) this start trains from.
        resumed: Whether this start goes on with an earlier start's log.
    """

    def __init__(self, directory, meter, config, start, resumed):
        super().__init__()
        self.path = run_log.path(directory)
        self.meter = meter
        self.config = config
        self.start = start
        self.resumed = resumed
        self._started = False

    def on_train_begin(self, logs=None):
        if self._started:
            return
        self._started = True
        import horovod
        import tensorflow as tf

        if not runtime.is_main_process():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.resumed:
            self.path.unlink(missing_ok=True)
        self._write(event="start", time=_now(), workers=runtime.size(),
                    start=dict(epoch=self.start[0], step=self.start[1]),
                    config=self.config.recorded(),
                    versions=dict(python=platform.python_version(), tensorflow=tf.__version__,
                                  keras=keras.__version__, horovod=horovod.__version__))

    def on_epoch_end(self, epoch, logs=None):
        if not runtime.is_main_process():
            return
        metrics = {k: float(v) for k, v in (logs or {}).items() if k != "examples_per_second"}
        self._write(event="epoch", time=_now(), epoch=epoch + 1, metrics=metrics,
                    throughput=_measurement(self.meter.epoch_measurement),
                    step_seconds=throughput.step_time_percentiles(self.meter.epoch_step_seconds))

    def on_train_end(self, logs=None):
        # A resumed epoch's rest is a fit of its own, ending before the last epoch.
        if runtime.is_main_process() and self.params["epochs"] == self.config.epochs:
            self._write(event="end", time=_now(), seconds=self.meter.seconds,
                        throughput=_measurement(self.meter.run_measurement))

    def _write(self, **record):
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")


def _now():
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _measurement(measurement):
    if measurement is None:
        return None
    rates = {name: dataclasses.asdict(getattr(measurement, name))
             for name in ("total", "per_worker")}
    for rate in rates.values():
        rate.update({k: None for k, v in rate.items() if isinstance(v, float) and math.isnan(v)})
    return dict(rates, workers=measurement.workers, window_steps=measurement.window_steps,
                warmup_steps=measurement.warmup_steps)
