"""Ranks leave a run together, and a rank that fails tells the others why.

A Horovod process that exits shuts Horovod down under every other rank, and
a rank still inside a collective then fails (a pipeline stage's leader
still gathering the model to export when the other ranks were done with
it). So a run ends, on every rank, in one last collective (`leave`), which
returns once every rank has finished all of its own.

A rank that fails cannot say so in a collective (the others wait in
another one): before it exits it writes its one line on the run's board
(faults/board.py, `fail`), and a rank whose collective fails because that
rank left reads it there and names the rank and its words (`why_stopped`).
A rank that finished normally waits in `leave`: it is never the one named.
"""

import contextlib
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.faults import watchdog

__all__ = ["arrive", "fail", "leave", "why_stopped"]

_SCOPE = "hvdtrain.departures"
# How long a failing rank that serves the board (rank 0 outside Gloo) keeps
# it up for the others to read its line.
_HEARD_SECONDS = 3.0
_POLL_SECONDS = 0.1


class _Run:
    def __init__(self, board, run, rank, size):
        self.board, self.scope, self.rank, self.size = board, f"{_SCOPE}.{run}", rank, size

    def others(self):
        return [r for r in range(self.size) if r != self.rank]


_run = None


def arrive(board, run):
    """This rank is in run `run` (its id), whose ranks write on `board`
    (None: nobody to tell, one process)."""
    global _run
    _run = _Run(board, run, hvd.rank(), hvd.size()) if board is not None else None


def leave():
    """Returns once every rank of the run has reached it, so has finished
    every collective of its own: call it on every rank at the run's end."""
    if hvd.size() == 1:
        return
    watchdog.progress("finished, waiting for the other workers to finish")
    hvd.allreduce(tf.constant(0), name="hvdtrain.leave")


def fail(line):
    """Tells the run's other ranks that this one fails with `line` (the
    message it prints), before it exits. A rank that serves the board lets
    the others learn of the failure at once (Horovod shut down) and waits
    a moment for them to read the line."""
    if _run is None:
        return
    _run.board.put(_run.scope, _run.rank, dict(line=line, time=time.time()))
    if not _run.board.served:
        return
    with contextlib.suppress(Exception):
        hvd.shutdown()
    deadline = time.monotonic() + _HEARD_SECONDS
    while (time.monotonic() < deadline
           and len(_run.board.read(_run.scope, _run.others())) < len(_run.others())):
        time.sleep(_POLL_SECONDS)


def why_stopped(reason):
    """Why this rank's collective failed, in words, once another rank left
    the run: that rank and the line it failed with, or (none said one: a
    process killed, a host lost) `reason`, what the collective raised."""
    said = {}
    if _run is not None:
        said = _run.board.read(_run.scope, _run.others())
        _run.board.put(_run.scope, _run.rank, dict(heard=True))
    failed = sorted((record["time"], rank, record["line"]) for rank, record in said.items()
                    if "line" in record)
    if not failed:
        return (f"stopped because another worker ended or stopped responding without a word "
                f"({reason}): killed, out of memory or its host lost; the launcher's report "
                "names it")
    _, rank, line = failed[0]
    also = sorted(r for _, r, _ in failed[1:])
    others = f" (rank{'s' * (len(also) > 1)} {', '.join(map(str, also))} too)" if also else ""
    return f"stopped because rank {rank} failed{others}: {line}"
