"""The run's JSON-lines log, written by rank 0 to `model_dir/log.jsonl`.

One object per line, each with an `event`:
- `start`: the time, the effective settings, the workers, the versions, and
  the (epoch, step) training starts from;
- `epoch`: the epoch's metrics as Keras reports them (averaged over the
  workers), its throughput (examples/s in total and per worker, warm-up
  excluded) and rank 0's step times (p50, p90, p99, max, in seconds);
- `end`: the run's throughput and its seconds.
A resumed run appends to the log of the run it continues (a later `epoch`
record of the same epoch replaces an earlier one); a new run starts a new log.
`hvdtrain report` plots it.
"""

import dataclasses
import datetime
import json
import math
import pathlib
import platform

import keras

from hvdtrain import runtime, throughput

FILE = "log.jsonl"


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _measurement(measurement):
    if measurement is None:
        return None
    rates = {name: dataclasses.asdict(getattr(measurement, name))
             for name in ("total", "per_worker")}
    for rate in rates.values():
        rate.update({k: None for k, v in rate.items() if isinstance(v, float) and math.isnan(v)})
    return dict(rates, workers=measurement.workers, window_steps=measurement.window_steps,
                warmup_steps=measurement.warmup_steps)


class RunLog(keras.callbacks.Callback):
    """Appends the records of a run to `directory/log.jsonl` on rank 0."""

    def __init__(self, directory, meter):
        super().__init__()
        self.path = pathlib.Path(directory) / FILE
        self.meter = meter

    def start(self, config, start, resumed):
        """The `start` record; a run that is not resumed begins a new log."""
        import horovod
        import tensorflow as tf

        if not runtime.is_main_process():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resumed:
            self.path.unlink(missing_ok=True)
        self._write(event="start", time=_now(), workers=runtime.size(),
                    start=dict(epoch=start[0], step=start[1]),
                    config=dataclasses.asdict(config),
                    versions=dict(python=platform.python_version(), tensorflow=tf.__version__,
                                  keras=keras.__version__, horovod=horovod.__version__))

    def on_epoch_end(self, epoch, logs=None):
        if not runtime.is_main_process():
            return
        metrics = {k: float(v) for k, v in (logs or {}).items() if k != "examples_per_second"}
        self._write(event="epoch", time=_now(), epoch=epoch + 1, metrics=metrics,
                    throughput=_measurement(self.meter.epoch_measurement),
                    step_seconds=throughput.step_time_percentiles(self.meter.epoch_step_seconds))

    def end(self, measurement, seconds):
        if runtime.is_main_process():
            self._write(event="end", time=_now(), seconds=seconds,
                        throughput=_measurement(measurement))

    def _write(self, **record):
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")


def read(directory):
    """The records of `directory/log.jsonl`, in order."""
    path = pathlib.Path(directory) / FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
