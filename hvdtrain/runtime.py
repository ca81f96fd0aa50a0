"""Process set-up for one Horovod worker, in the order that matters.

`init()` starts Horovod, pins this process to one GPU (by local rank, with
memory growth) and sizes TensorFlow's thread pools so that the processes on a
host share its cores instead of oversubscribing them. It must run before any
TensorFlow op: device and thread settings are frozen once the runtime starts.

GPUs are the ones TensorFlow sees, so a CUDA_VISIBLE_DEVICES set by the
scheduler (Slurm's --gpus-per-task, Kubernetes' device plugin) is respected:
a process that sees one GPU uses it, one that sees a GPU per local process
takes its local rank's.
"""

import contextlib
import os

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from absl import logging

from hvdtrain import layout
from hvdtrain.errors import UsageError
from hvdtrain.faults import broken_pipes, departures, launcher_watch, watchdog
from hvdtrain.faults.board import Board, open_for_run

__all__ = ["barrier", "choose_mpi_wait", "communication_has_a_core", "default_intra_op_threads",
           "device_name", "gpu_index", "gradients_overlap_backprop", "init", "is_main_process",
           "leave_together", "local_rank", "local_size", "main_process_first", "pin_gpu",
           "precision_warning", "rank", "set_log_verbosity", "size", "stop_watching"]

# Horovod's own functions, with Horovod's docstrings: each returns an int
# and raises ValueError until `init` has run.
rank = hvd.rank
size = hvd.size
local_rank = hvd.local_rank
local_size = hvd.local_size
_every_rank_logs = False
# Open MPI's setting for how a rank waits for its peers (read at MPI_Init).
_OPEN_MPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def init(intra_op_threads=0, inter_op_threads=0, precision=None, process_sets=None,
         comm=None, stall_timeout=None, timeline=False, verbose_all_ranks=False,
         tensor_parallel=1, pipeline_parallel=1, mpi_wait="auto"):
    """Initialises Horovod and this process's devices, threads and precision.

    Call it once per process, before any TensorFlow op (see the module's
    docstring for why).

    Args:
        intra_op_threads: Threads for one op; 0 means host cores / local processes.
        inter_op_threads: Threads running independent ops; 0 keeps TF's default.
        precision: A Keras dtype policy (e.g. mixed_float16); None keeps the
            current one. On a GPU without the tensor cores it needs, rank 0
            logs a warning.
        process_sets: Horovod process sets to create with the global one.
        comm: Horovod's `comm`: the MPI communicator or ranks to run on.
        stall_timeout: Seconds after which Horovod's stall check shuts all
            ranks down when some rank stopped submitting tensors (it waits
            forever otherwise); unless set in the environment (or horovodrun's).
            hvdtrain's watchdog, from here to `stop_watching()`, ends the job
            after 3 times that without progress on some rank (watchdog.progress).
        timeline: Allow Horovod's timeline to be started and stopped during
            training (hvd.start_timeline), which Horovod decides at init.
        verbose_all_ranks: Every rank logs its progress, not only rank 0.
        tensor_parallel: T: the workers form replicas of T consecutive ranks
            that split tensor-parallel layers (hvdtrain.layout); more than 1
            starts Horovod with dynamic process sets, unless `process_sets`
            says otherwise, and makes the groups' sets.
        pipeline_parallel: P: each replica's model runs as P pipeline
            stages on P ranks (hvdtrain.layout), with process sets as for
            `tensor_parallel`.
        mpi_wait: Under Open MPI, how a rank waits for its peers: "poll",
            "yield" or "auto" (`choose_mpi_wait`); Horovod starts MPI in
            `hvd.init`, which reads it.

    Raises:
        UsageError: If `timeline` is asked for while horovodrun already
            records a timeline of the whole run, more processes share this
            host than it has GPUs, or tensor_parallel x pipeline_parallel
            does not divide the number of workers.
    """
    global _every_rank_logs
    _every_rank_logs = verbose_all_ranks
    if stall_timeout:
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", f"{stall_timeout:.0f}")
        # Checked every this often (Horovod ignores a shutdown time below it);
        # a stalled tensor from the response cache is reported a check later.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS",
                              f"{max(1, min(stall_timeout / 4, 60)):.0f}")
    recording = os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC") if timeline else None
    waiting = _set_mpi_wait(mpi_wait, intra_op_threads)
    board = Board.from_environment()
    if stall_timeout:
        # Well after Horovod's stall check (told stall_timeout), where that can act.
        watchdog.start(3 * stall_timeout, board)
    if (tensor_parallel != 1 or pipeline_parallel != 1) and process_sets is None:
        process_sets = "dynamic"
    hvd.init(comm=comm, process_sets=process_sets)
    if recording not in (None, "DYNAMIC"):
        # After init, which every rank reaches together: all of them say it
        # before the launcher sees the first exit and stops the others.
        watchdog.stop()
        raise UsageError(f"horovodrun already records a timeline to {recording} for the "
                         "whole run; drop --timeline_steps or horovodrun's --timeline-filename")
    # Before any TensorFlow op (the board's broadcast is one): they freeze both.
    gpu = pin_gpu()
    _set_threads(intra_op_threads or default_intra_op_threads(), inter_op_threads)
    watchdog.progress("setting up")
    if hvd.size() > 1:
        board, run = open_for_run(board)
        watchdog.use_board(board)
        departures.arrive(board, run)
    else:
        departures.arrive(None, None)
    layout.arrange(tensor_parallel, pipeline_parallel)
    broken_pipes.install()     # a launcher that dies must not take the checkpoint with it
    launcher_watch.start(hvd.rank())
    if precision is not None:
        # Layers take the policy when they are created: set it before any model.
        keras.mixed_precision.set_global_policy(precision)
    set_log_verbosity()
    if waiting and is_main_process():
        logging.info(waiting)
    if gpu is not None:
        details = tf.config.experimental.get_device_details(gpu)
        warning = precision_warning(keras.mixed_precision.global_policy().name,
                                    details.get("compute_capability"), details.get("device_name"))
        if warning and is_main_process():
            logging.warning(warning)


def leave_together():
    """Returns once every rank has reached it: the run's last collective
    (faults/departures.py). Call it on every rank as a run ends well."""
    departures.leave()


def stop_watching():
    """Ends the watchdog init started: the run is over."""
    watchdog.stop()


def set_log_verbosity():
    """Rank 0 reports progress; the other ranks log only warnings and errors
    (unless init was told verbose_all_ranks). Call again when ranks change
    (an elastic restart)."""
    loud = is_main_process() or _every_rank_logs
    logging.set_verbosity(logging.INFO if loud else logging.WARNING)


def default_intra_op_threads(local_size=None):
    """Host cores shared evenly by the Horovod processes on this host
    (`local_size` of them; None: Horovod's count, once it is started)."""
    cores = len(os.sched_getaffinity(0))
    return max(1, cores // (local_size or hvd.local_size()))


def choose_mpi_wait(choice, intra_op_threads, local_size, cores):
    """"poll" or "yield": how the MPI ranks of a host with `cores` cores
    wait for their peers. Open MPI polls by default (it yields only when
    mpirun starts more ranks than slots): Horovod's background thread,
    waiting in a collective, spins on a core. That core is a worker's own
    once the local_size workers' compute threads and background threads
    take every core, and polling there slows the step it waits for
    (bench/alternatives.py under MPI on 2 cores: 0.80 of
    MultiWorkerMirroredStrategy's rate polling, 1.14 yielding). `choice`
    "poll" or "yield" decides instead of "auto"."""
    if choice != "auto":
        return choice
    return "poll" if communication_has_a_core(intra_op_threads, local_size, cores) else "yield"


def communication_has_a_core(intra_op_threads, local_size, cores):
    """Whether the `local_size` workers of a host with `cores` cores, each
    running its intra-op threads and Horovod's background thread, leave
    Horovod's threads a core of their own (else what they do while the
    step computes, polling or exchanging, takes a worker's core)."""
    return local_size * (intra_op_threads + 1) <= cores


def gradients_overlap_backprop():
    """Whether each gradient's allreduce should start as soon as backprop
    makes it (True), or all of them together once the last one is made.
    Overlap hides the exchange behind the backward pass where it runs
    beside the compute: on GPUs, and on CPU hosts with a core for Horovod's
    threads. Where the workers' threads fill the cores it hides nothing,
    and each gradient ready apart costs a cycle of Horovod's coordination
    on a worker's core (bench/alternatives.py under Gloo on 2 cores: 0.93
    of one grouped allreduce's rate, 10 ms more CPU a step)."""
    if tf.config.list_logical_devices("GPU"):
        return True
    cores = len(os.sched_getaffinity(0))
    threads = tf.config.threading.get_intra_op_parallelism_threads() or cores
    return communication_has_a_core(threads, hvd.local_size(), cores)


def _set_mpi_wait(choice, intra_op_threads):
    """Sets Open MPI's mpi_yield_when_idle for this process (read when
    Horovod starts MPI) as `choose_mpi_wait` decides; returns what it
    chose, in words, or None (not started by Open MPI's mpirun, or auto
    with the setting already in the environment: the user's)."""
    local_size = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if local_size is None or choice == "auto" and _OPEN_MPI_YIELD in os.environ:
        return None
    cores = len(os.sched_getaffinity(0))
    local_size = int(local_size)
    threads = intra_op_threads or default_intra_op_threads(local_size)
    wait = choose_mpi_wait(choice, threads, local_size, cores)
    os.environ[_OPEN_MPI_YIELD] = "1" if wait == "yield" else "0"
    how = "yield their core" if wait == "yield" else "poll on a core"
    return (f"MPI ranks {how} while they wait ({local_size} on this host x ({threads} intra-op "
            f"+ 1 Horovod thread) on {cores} cores, --mpi_wait={choice})")


def is_main_process():
    """Whether this is the one process (rank 0) that writes files and logs.

    Returns:
        A bool.

    Raises:
        ValueError: If Horovod is not initialised (call `init` first).
    """
    return hvd.rank() == 0


@contextlib.contextmanager
def main_process_first():
    """Runs the block on rank 0 first, then on the others (e.g. building a
    dataset that the others then find ready)."""
    if not is_main_process():
        barrier()
    yield
    if is_main_process():
        barrier()


def barrier():
    hvd.allreduce(tf.constant(0), name="hvdtrain.barrier")


def device_name():
    """The name of the GPU this process trains on, or "CPU"."""
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return "CPU"
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def pin_gpu():
    """Makes one GPU this process's only one, growing its memory as needed
    (TensorFlow would take all of it at start); returns it, or None."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    gpu = gpus[gpu_index(len(gpus), hvd.local_rank(), hvd.local_size(),
                         os.environ.get("CUDA_VISIBLE_DEVICES"))]
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, "GPU")
    return gpu


def gpu_index(visible, local_rank, local_size, cuda_visible_devices):
    """Which of the `visible` GPUs this process trains on: one process per
    GPU, as NCCL requires (two ranks on one GPU fail in NCCL's set-up)."""
    if visible == 1 and (local_size == 1 or cuda_visible_devices):
        return 0   # the scheduler gave each process its own GPU
    if visible >= local_size:
        return local_rank
    raise UsageError(
        f"{local_size} processes on this host share {visible} GPU{'s' * (visible > 1)}: "
        "start one process per GPU (horovodrun -np/-H slots, Slurm --ntasks-per-node), "
        "or give each process its own with CUDA_VISIBLE_DEVICES")


def precision_warning(policy, compute_capability, device_name):
    """Why `policy` will be slow on a GPU of `compute_capability` (major,
    minor), or None: float16 needs tensor cores (7.0), bfloat16 Ampere's (8.0)."""
    needs = {"mixed_float16": (7, 0), "mixed_bfloat16": (8, 0)}.get(policy)
    if needs is None or compute_capability is None or tuple(compute_capability) >= needs:
        return None
    have = ".".join(map(str, compute_capability))
    return (f"{policy} on {device_name or 'this GPU'} (compute capability {have}) has no "
            f"tensor-core speed-up (it needs {needs[0]}.{needs[1]}): float32 may be as fast")


def _set_threads(intra, inter):
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        # A process that initialises again (several runs in one process)
        # finds the pools as they were sized: only a change is worth a word.
        if (tf.config.threading.get_intra_op_parallelism_threads() != intra
                or inter and tf.config.threading.get_inter_op_parallelism_threads() != inter):
            logging.warning("TensorFlow was running before hvdtrain.init(); "
                            "its thread pools keep their sizes")
