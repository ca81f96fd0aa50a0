"""The run's JSON-lines log, written by rank 0 to `model_dir/log.jsonl`
(by callbacks.RunLog).

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

import json
import pathlib

__all__ = ["FILE", "path", "read"]

FILE = "log.jsonl"


def path(directory):
    """The log of the run whose model directory is `directory`."""
    return pathlib.Path(directory) / FILE


def read(directory):
    """The records of `directory/log.jsonl`, in order."""
    return [json.loads(line) for line in path(directory).read_text().splitlines()
            if line.strip()]
