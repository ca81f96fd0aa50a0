"""One run at a time per model directory.

Rank 0 holds an exclusive flock on `<model_dir>/run.lock` from the run's
start to its last write: a second job started on the same directory (even at
the same moment, before any checkpoint exists) is refused on every rank with
the owner's host, pid and start time, instead of interleaving its log,
checkpoints and model with the first's. The kernel drops the lock when the
owning process ends, however it ends, so a crashed run never blocks the next.
"""

import datetime
import fcntl
import json
import os
import pathlib
import socket

from hvdtrain import runtime
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives

__all__ = ["FILE", "acquire", "release"]

FILE = "run.lock"
_held = {}   # model directory -> the open file holding its lock


def acquire(model_dir):
    """Makes this job the owner of `model_dir` (rank 0 takes the lock); on
    every rank, raises UsageError naming the owner if another job holds it."""
    model_dir = pathlib.Path(model_dir)
    error = None
    if runtime.is_main_process() and model_dir not in _held:
        try:
            _held[model_dir] = _lock(model_dir)
        except UsageError as e:
            error = e
    collectives.raise_together(error)


def release(model_dir):
    """Gives `model_dir` up (the process's end does it too)."""
    held = _held.pop(pathlib.Path(model_dir), None)
    if held is not None:
        held.close()


def _lock(model_dir):
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        # Not truncated on open: the owner's details stay readable until locked.
        held = open(os.open(model_dir / FILE, os.O_RDWR | os.O_CREAT, 0o644), "r+")
    except OSError as e:
        raise UsageError(f"cannot use --model_dir={model_dir}: {e.strerror}; "
                         "choose a writable directory") from None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(held)
        held.close()
        raise UsageError(f"{model_dir} is in use by another run ({owner}); wait for it to end "
                         "or choose another --model_dir") from None
    held.seek(0)
    held.truncate()
    json.dump(dict(host=socket.gethostname(), pid=os.getpid(),
                   since=datetime.datetime.now().astimezone().isoformat(timespec="seconds")),
              held)
    held.flush()
    return held


def _owner(held):
    try:
        owner = json.loads(held.read())
        return f"host {owner['host']}, pid {owner['pid']}, since {owner['since']}"
    except (ValueError, KeyError, TypeError):
        # The owner has locked but not yet written its details.
        return "starting now"
