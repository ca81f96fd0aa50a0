"""Whether a worker's part of the model fits the memory it has, checked
before anything is allocated: a table that cannot fit is refused in one
line naming the size it needs, instead of an out-of-memory kill mid-build."""

import os
import subprocess

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives

__all__ = ["available_bytes", "refuse_too_large"]

# The part of a worker's memory one variable may take: the optimizer's slots
# (up to two per weight for Adam) and the step's activations need the rest.
SHARE = 1 / 3


def available_bytes():
    """The memory one worker on this host may use: the smallest GPU's (one
    GPU per worker; None if nvidia-smi cannot tell), or the host's available
    memory shared by the host's workers."""
    if tf.config.list_physical_devices("GPU"):
        return _smallest_gpu()
    return _host_available() // max(hvd.local_size(), 1)


def refuse_too_large(what, nbytes):
    """Raises on every worker if some worker's `nbytes` for `what` exceed
    SHARE of its memory. Call it on every worker.

    Raises:
        UsageError: Naming `what`, the bytes it needs and those there are.
    """
    available = available_bytes()
    budget = None if available is None else int(available * SHARE)
    error = None
    if budget is not None and nbytes > budget:
        error = UsageError(
            f"{what} needs {_size(nbytes)} on this worker, more than the {_size(budget)} it "
            f"may take (a third of {_size(budget / SHARE)}): shard it over more workers, or "
            "make it smaller")
    collectives.raise_together(error)


def _smallest_gpu():
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True).stdout.split()
        return min(int(mib) for mib in listed) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _host_available():
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024 if "MemAvailable" in fields else (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _size(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
