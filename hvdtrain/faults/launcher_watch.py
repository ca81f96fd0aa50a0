"""Ends a worker whose launcher is gone.

Killing `horovodrun --mpi` (SIGTERM, SIGHUP, SIGKILL) kills it only: it
runs mpirun as its child (Horovod's own replaces itself with `/bin/sh -c
"mpirun ..."`, whose death is the same), and mpirun and its workers, no
longer supervised by anyone, would train on to the end and keep writing the
model directory. So a worker watches the processes that launched it: its
parent (mpirun, or on other hosts MPI's daemon, which exits with mpirun;
horovodrun's shell under Gloo), the MPI processes above that (MPICH's proxy
runs under mpiexec), and the horovodrun or `sh -c` that runs the topmost of
them (a wrapper script's shell too).
When one of them is gone (the worker or the launcher was re-parented), the
worker exits non-zero within a second; mpirun then stops the job's other
workers, on every host. A run that stops cleanly on a signal
(hvdtrain.faults.preemption) takes the launcher's exit as one: its workers agree
on a step, write a checkpoint and exit, or are ended after
_STOP_GRACE_SECONDS. An interactive shell that started mpirun (e.g. under
nohup) is not watched: leaving it is no reason to stop.
"""

import os
import sys
import threading

from hvdtrain.faults import preemption

__all__ = ["start"]

_MPI_PROCESSES = {"mpirun", "mpiexec", "orterun", "prterun", "mpiexec.hydra", "orted", "prted",
                  "hydra_pmi_proxy"}
_LAUNCHED_BY = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_CHECK_SECONDS = 1.0
# A checkpoint being written, one step and the agreement fit in this (the
# watch's own backstop for a run that cannot stop cleanly).
_STOP_GRACE_SECONDS = 30.0
_watching = threading.Event()


def start(rank):
    """Watches this worker's launchers from a thread, if a launcher started
    it (once per process: its launchers do not change)."""
    if _watching.is_set() or not any(name in os.environ for name in _LAUNCHED_BY):
        return
    chain = launch_chain(os.getpid())
    if chain:
        _watching.set()
        threading.Thread(target=_watch, args=(rank, chain), name="hvdtrain-launcher-watch",
                         daemon=True).start()


def launch_chain(pid):
    """[(process, its parent)] to watch for `pid`: its parent, the MPI
    processes above it and the horovodrun or `sh -c` that runs the topmost."""
    parent = _parent(pid)
    if parent is None or parent <= 1:
        return []
    chain = [(pid, parent)]
    while _name(parent) in _MPI_PROCESSES:
        above = _parent(parent)
        if not above or above <= 1 or not (_name(above) in _MPI_PROCESSES
                                            or _is_launcher(_argv(above))):
            break
        chain.append((parent, above))
        parent = above
    return chain


def gone(chain):
    """The first launcher in `chain` that is gone, or None."""
    for child, parent in chain:
        if _parent(child) != parent:
            return parent
    return None


def _watch(rank, chain):
    stop = threading.Event()
    while not stop.wait(_CHECK_SECONDS):
        launcher = gone(chain)
        if launcher is None:
            continue
        if preemption.handling():
            preemption.request(f"launcher pid {launcher} gone")
            stop.wait(_STOP_GRACE_SECONDS)
        sys.stderr.write(f"hvdtrain: error: rank {rank}: the launcher (pid {launcher}) is "
                         "gone; stopping this worker\n")
        sys.stderr.flush()
        os._exit(1)


def _parent(pid):
    """`pid`'s parent; None if it is gone. Without /proc only our own is known."""
    if pid == os.getpid():
        return os.getppid()
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name (in parentheses) may hold spaces: read after it.
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[1])


def _argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _name(pid):
    argv = _argv(pid)
    return os.path.basename(argv[0]) if argv else None


def _is_launcher(argv):
    """horovodrun (a Python script) or a shell's `-c` command."""
    names = [os.path.basename(arg) for arg in argv[:2]]
    return "horovodrun" in names or (
        len(argv) > 2 and names[0] in ("sh", "bash", "dash") and argv[1] == "-c")
