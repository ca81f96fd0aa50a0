"""Ends a job that makes no progress, naming the rank it waits for.

A rank that hangs (an input pipeline, a file read, a deadlock, a lost host)
leaves the others waiting in a collective forever: Horovod's stall check
acts only with the MPI controller, and only on tensors, not before the first
collective. So from `hvd.init` to the run's last write every rank marks its
progress (a phase such as "loading data", then each batch) with `progress`,
and a thread publishes a heartbeat every few seconds: phase, seconds since
the last progress, and whether the rank is blocked inside a collective
(its main thread's innermost own frame is Horovod's or hvdtrain's
collectives) or in its own work.

The heartbeats go to the job's board (faults/board.py), a key-value store
every rank can reach. When a rank has made no progress for `timeout` seconds, it reads
every heartbeat, names the rank(s) the others wait for (one that sends no
heartbeat, else those outside a collective) and exits non-zero; the launcher
then stops the others.
"""

import contextlib
import os
import socket
import sys
import sysconfig
import threading
import time

import horovod
import horovod.tensorflow as hvd
import keras
import tensorflow as tf

__all__ = ["counted", "paused", "progress", "stall_message", "start", "stop", "use_board"]

_SCOPE = "hvdtrain.heartbeat"
# Frames of these are how a rank runs, not where it is: skipped when looking
# for the innermost frame that says what the rank waits in.
_LIBRARIES = tuple(os.path.dirname(m.__file__) + os.sep for m in (tf, keras))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_COLLECTIVES = (os.path.dirname(horovod.__file__) + os.sep,
                os.path.join(os.path.dirname(os.path.dirname(__file__)), "parallel",
                             "collectives.py"))

_watchdog = None
_delivered = None   # batches the datasets given to fit delivered (a tf.Variable)


class Watchdog:
    """Watches this process's progress (see the module's doc)."""

    def __init__(self, timeout, board=None):
        self.timeout = timeout
        self.board = board
        self.phase = "starting Horovod"
        self._last = time.monotonic()
        self._paused = 0
        self._stop = threading.Event()
        self._publishing = threading.Lock()   # the last heartbeat is stop()'s
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog",
                                        daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        """Stops watching; the others then know this rank is done, not lost."""
        with self._publishing:
            self._stop.set()
            self._publish(dict(self.heartbeat(), phase="finished", done=True))

    def progress(self, phase=None):
        self._last = time.monotonic()
        if phase:
            self.phase = phase

    @contextlib.contextmanager
    def paused(self, phase):
        """Not watched in the block: for waits bounded by someone else."""
        self.progress(phase)
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self.progress()

    def heartbeat(self):
        return dict(host=socket.gethostname(), pid=os.getpid(), phase=self.phase,
                    idle=round(self._idle(), 1), waiting=_in_collective(),
                    batches=None if _delivered is None else int(_delivered.numpy()),
                    time=time.time())

    def _publish(self, beat):
        rank, _ = _rank_and_size()
        if self.board is not None and rank is not None:
            self.board.put(_SCOPE, rank, beat)

    def _idle(self):
        return 0.0 if self._paused else time.monotonic() - self._last

    def _watch(self):
        while not self._stop.wait(min(self.timeout / 4, 5.0)):
            rank, size = _rank_and_size()
            beat = self.heartbeat()
            with self._publishing:
                if self._stop.is_set():
                    return
                self._publish(beat)
            if self._idle() > self.timeout:
                beats = (self.board.read(_SCOPE, range(size)) if self.board is not None and size
                         else {})
                if rank is not None:
                    beats[rank] = beat
                sys.stderr.write(stall_message(beats, size or 1, self.timeout, time.time()) + "\n")
                sys.stderr.flush()
                os._exit(1)


def stall_message(beats, size, timeout, now):
    """The line that ends a stalled job, from the ranks' heartbeats."""
    silent = [r for r in range(size) if r not in beats or (
        now - beats[r]["time"] > timeout and not beats[r].get("done"))]
    working = [r for r in range(size) if r in beats and not beats[r]["waiting"]
               and not beats[r].get("done")]
    blamed = silent or _fewest_batches(working, beats) or sorted(beats)
    waiting = [r for r in sorted(beats) if r not in blamed and not beats[r].get("done")]
    named = "; ".join(_describe(r, beats.get(r), r in silent) for r in blamed)
    text = (f"hvdtrain: error: no progress for {timeout:g} s: "
            f"{_ranks(blamed)} stopped making progress ({named})")
    if waiting:
        text += (f"; {_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for "
                 f"{'it' if len(blamed) == 1 else 'them'} in a collective")
    return (text + "; stopping the job (if a step can take that long, raise --stall_timeout)")


def _fewest_batches(ranks, beats):
    """Of `ranks` (all inside a training step: a collective in a traced
    step shows no Horovod frame), those whose input delivered the fewest
    batches: the others got theirs and wait in the step's allreduce."""
    counts = {r: beats[r].get("batches") for r in ranks}
    if None in counts.values():
        return ranks
    return [r for r in ranks if counts[r] == min(counts.values(), default=0)]


def _describe(rank, beat, silent):
    if beat is None:
        return f"rank {rank}: no heartbeat, its process or host is gone"
    where = f"rank {rank} on {beat['host']}, pid {beat['pid']}: {beat['phase']}"
    return where + (", heartbeat lost" if silent else f", idle {beat['idle']:.0f} s")


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _in_collective():
    """True if the main thread is blocked in a collective: its innermost
    frame outside TensorFlow, Keras, the standard library and generated code
    is Horovod's (or hvdtrain's collectives, whose tf.functions run in
    TensorFlow)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        path = frame.f_code.co_filename
        # "<string>": an op's generated wrapper, Horovod's too.
        if not (path.startswith(("<", *_LIBRARIES)) or (path.startswith(_STDLIB)
                                                       and "-packages" not in path)):
            return path.startswith(_COLLECTIVES)
        frame = frame.f_back
    return False


def _rank_and_size():
    """Horovod's, or before init (and during an elastic reset) the launcher's."""
    with contextlib.suppress(ValueError):
        if hvd.is_initialized():
            return hvd.rank(), hvd.size()
    for rank, size in (("HOROVOD_RANK", "HOROVOD_SIZE"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ.get(size, 0)) or None
    return None, None


def counted(dataset):
    """`dataset`, counting the batches it delivers: what tells, inside a
    training step, a rank waiting for its input from one waiting for its
    peers."""
    global _delivered
    if _delivered is None:
        _delivered = tf.Variable(0, dtype=tf.int64, trainable=False)
    counter = _delivered

    def count(*batch):
        with tf.control_dependencies([counter.assign_add(1)]):
            batch = tf.nest.map_structure(tf.identity, batch)
        return batch if len(batch) > 1 else batch[0]

    return dataset.map(count)


def start(timeout, board=None):
    """Starts watching this process; `progress` marks it moving on."""
    global _watchdog
    stop()
    _watchdog = Watchdog(timeout, board)
    _watchdog.start()


def use_board(board):
    if _watchdog is not None:
        _watchdog.board = board


def progress(phase=None):
    """This rank moved on (to `phase`, a few words: "loading data")."""
    if _watchdog is not None:
        _watchdog.progress(phase)


def paused(phase):
    return _watchdog.paused(phase) if _watchdog is not None else contextlib.nullcontext()


def stop():
    global _watchdog
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None

