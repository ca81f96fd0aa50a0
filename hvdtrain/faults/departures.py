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
# One key for the line of a rank that failed (the last to say one): a
# bystander reads one key, however many ranks the job has.
_FAILED = "failed"
# How long a failing rank that serves the board (rank 0 outside Gloo) keeps
# it up for the others to read its line.
_HEARD_SECONDS = 2.0


class _Run:
    def __init__(self, board, run, rank):
        self.board, self.scope, self.rank = board, f"{_SCOPE}.{run}", rank


_run = None


def arrive(board, run):
    """This rank is in run `run` (its id), whose ranks write on `board`
    (None: nobody to tell, one process)."""
    global _run
    _run = _Run(board, run, hvd.rank()) if board is not None else None


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
    the others learn of the failure at once (Horovod shut down) and keeps
    the board a moment for them to read the line."""
    if _run is None:
        return
    _run.board.put(_run.scope, _FAILED, dict(rank=_run.rank, line=line))
    if _run.board.served:
        with contextlib.suppress(Exception):
            hvd.shutdown()
        time.sleep(_HEARD_SECONDS)


def why_stopped(reason):
    """Why this rank's collective failed, in words, once another rank left
    the run: that rank and the line it failed with, or (none said one: a
    process killed, a host lost) `reason`, what the collective raised."""
    said = _run.board.read(_run.scope, [_FAILED]).get(_FAILED) if _run is not None else None
    if said is None:
        return (f"stopped because another worker ended or stopped responding without a word "
                f"({reason}): killed, out of memory or its host lost; the launcher's report "
                "names it")
    return f"stopped because rank {said['rank']} failed: {said['line']}"
