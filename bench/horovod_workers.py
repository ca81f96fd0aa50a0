"""Running a benchmark's own script as Horovod workers on this host."""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from absl import flags


def run(script, output, np=2, controller="gloo", **flags):
    """Runs `script --worker --output=OUTPUT --NAME=VALUE...` as `np`
    processes with one intra-op thread each (flags whose value is None are
    left out); returns the JSON its rank 0 wrote to `output`."""
    command = ["horovodrun", "-np", str(np), "-H", f"localhost:{np}", f"--{controller}",
               sys.executable, script, "--worker", f"--output={output}",
               *(f"--{name}={value}" for name, value in flags.items() if value is not None)]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                   stdout=subprocess.DEVNULL)
    return json.loads(pathlib.Path(output).read_text())


def main(launch, work):
    """The absl main of a benchmark run by `run`: `launch()` when started by
    hand, `work(scratch)` in a worker (its --worker flag), with a scratch
    folder of its own."""
    def run_one(argv):
        if not flags.FLAGS.worker:
            launch()
            return
        with tempfile.TemporaryDirectory() as scratch:
            work(scratch)
    return run_one


def side_by_side(names, fit, epochs):
    """Trains the runs `names` an epoch at a time, the order turned each
    epoch; fit(name, epoch) trains one and returns its rate (epoch 0, which
    traces and compiles, is left out).

    Returns:
        The report's numbers: each run's median rate, its rates, its ratios
        to the first run's in the same epochs and their median, and the
        noise: the first run's rate / its rate in the epoch before, lowest
        and highest.
    """
    for name in names:
        fit(name, 0)
    rates = {name: [] for name in names}
    for epoch in range(1, epochs):
        for name in names[::1 if epoch % 2 else -1]:
            rates[name].append(fit(name, epoch))
    first = rates[names[0]]
    ratios = {name: [a / b for a, b in zip(rates[name], first)] for name in names[1:]}
    drift = [b / a for a, b in zip(first, first[1:])]
    return dict(examples_per_second={n: statistics.median(r) for n, r in rates.items()},
                ratio={n: statistics.median(r) for n, r in ratios.items()}, ratios=ratios,
                rates=rates, noise=[min(drift, default=1.0), max(drift, default=1.0)])
