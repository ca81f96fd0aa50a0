"""Running a benchmark's own script as Horovod workers on this host."""

import json
import os
import pathlib
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
