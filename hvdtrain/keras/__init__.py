"""Horovod's `horovod.tensorflow.keras` API on Keras 3, for scripts written
against it:

    import hvdtrain.keras as hvd        # was: import horovod.tensorflow.keras as hvd

The same names and signatures, backed by hvdtrain's Keras 3 optimizer and
callbacks and by Horovod's TensorFlow collectives. Differences: `init()` also
pins the GPU and sizes the thread pools (see hvdtrain.runtime); Keras 3 has
no global variables, so `broadcast_global_variables` refuses (use
`broadcast_variables` or `callbacks.BroadcastGlobalVariablesCallback`).
`elastic` holds KerasState and the elastic callbacks for Keras 3. It
depends on parallel, callbacks and state; only users' scripts depend on it.
"""

import horovod.tensorflow as _hvd
import keras
import tensorflow as tf
from horovod.tensorflow import (  # noqa: F401  (re-exported as Horovod's keras module does)
    Adasum,
    Average,
    ProcessSet,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)

from hvdtrain import runtime
from hvdtrain.errors import UsageError
from hvdtrain.keras import callbacks, elastic  # noqa: F401
from hvdtrain.parallel.collectives import broadcast_variables, root_name_scope  # noqa: F401
from hvdtrain.parallel.data_parallel.compression import BF16Compressor, Compression
from hvdtrain.parallel.data_parallel.optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
    make_distributed,
)
from hvdtrain.parallel.data_parallel.reduction import GradientReducer

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "PartialDistributedOptimizer",
    "ProcessSet", "Sum", "add_process_set", "allgather", "allreduce", "broadcast",
    "broadcast_global_variables", "broadcast_variables", "callbacks", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built",
    "gloo_enabled", "init", "is_initialized", "load_model", "local_rank", "local_size",
    "make_distributed", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline",
    "stop_timeline"]


def init(comm=None, process_sets=None):
    """Horovod's `init`, then this process's GPU and thread set-up.

    See `hvdtrain.init` (`hvdtrain.runtime.init`), which this calls with
    its defaults for everything else.

    Args:
        comm: Horovod's `comm`: the MPI communicator or ranks to run on.
        process_sets: Horovod process sets to create with the global one.

    Raises:
        UsageError: As for `hvdtrain.init`.
    """
    runtime.init(process_sets=process_sets, comm=comm)


def broadcast_global_variables(root_rank):
    """Horovod's TF1 global-variable broadcast, which Keras 3 has no use for.

    Args:
        root_rank: Accepted for Horovod's signature.

    Raises:
        UsageError: Always, naming the Keras 3 way: `broadcast_variables` or
            `callbacks.BroadcastGlobalVariablesCallback`.
    """
    raise UsageError("broadcast_global_variables: Keras 3 has no global variables; use "
                     "hvd.broadcast_variables(model.variables, root_rank) or "
                     "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)")


# The collectives take anything convertible to a tensor and, like Horovod's
# under TensorFlow 2, return eager tensors (`.numpy()`, `np.asarray`). Inside
# a tf.function an unnamed one would be named after its tensor, whose name
# can differ between ranks: it gets a fixed name at the graph's top level,
# made unique by the order of the calls (see hvdtrain.parallel.data_parallel.reduction).

def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Reduces `value` over all ranks.

    Args:
        value: Anything convertible to a tensor, of the same shape on
            every rank.
        name: The collective's name, the same on every rank; None: a fixed
            name, made unique by the order of the calls.
        average: Horovod's older switch: True for `op=Average`, False for
            `op=Sum`; None: `op` decides.
        prescale_factor: Multiplies `value` before the reduction.
        postscale_factor: Multiplies the result after it.
        op: `Average` (the default), `Sum` or `Adasum`.
        compression: `Compression.none` or `Compression.fp16`.

    Returns:
        The reduced tensor.

    Raises:
        UsageError: If `compression` is `Compression.bf16`, which is for
            gradients only.
        ValueError: If both `average` and `op` are given (Horovod's check).
    """
    if compression is BF16Compressor:
        raise UsageError("bf16 compression is for gradients (DistributedOptimizer, "
                         "DistributedGradientTape); use none or fp16 here")
    with root_name_scope():
        return _hvd.allreduce(tf.convert_to_tensor(value), average=average,
                              prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor, op=op,
                              compression=compression, name=name or "hvdtrain.allreduce",
                              ignore_name_scope=True)


def allgather(value, name=None):
    """Concatenates every rank's `value` along the first dimension, in rank order.

    Args:
        value: Anything convertible to a tensor; the first dimension may
            differ between ranks, the others may not.
        name: The collective's name, the same on every rank; None: a fixed
            name, made unique by the order of the calls.

    Returns:
        The gathered tensor.
    """
    with root_name_scope():
        return _hvd.allgather(tf.convert_to_tensor(value), name=name or "hvdtrain.allgather",
                              ignore_name_scope=True)


def broadcast(value, root_rank, name=None):
    """Sends `root_rank`'s `value` to every rank.

    Args:
        value: Anything convertible to a tensor, of the same shape and
            dtype on every rank.
        root_rank: The rank whose value all get.
        name: The collective's name, the same on every rank; None: a fixed
            name, made unique by the order of the calls.

    Returns:
        `root_rank`'s value, as a tensor.
    """
    with root_name_scope():
        return _hvd.broadcast(tf.convert_to_tensor(value), root_rank,
                              name=name or "hvdtrain.broadcast", ignore_name_scope=True)


def reducescatter(value, name=None, op=Average):
    """Reduces `value` over all ranks and gives each its slice of the first dimension.

    Args:
        value: Anything convertible to a tensor, of the same shape on
            every rank.
        name: The collective's name, the same on every rank; None: a fixed
            name, made unique by the order of the calls.
        op: `Average` (the default) or `Sum`.

    Returns:
        This rank's part of the reduced tensor, the first dimension divided
        across the ranks as Horovod divides it.
    """
    with root_name_scope():
        return _hvd.reducescatter(tf.convert_to_tensor(value), op=op,
                                  name=name or "hvdtrain.reducescatter", ignore_name_scope=True)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Loads a `.keras` model and makes its optimizer distributed.

    The optimizer keeps the state it was saved with (slots, iterations), as
    Horovod's does (see `make_distributed`).

    Args:
        filepath: The `.keras` file.
        custom_optimizers: Optimizer classes the file may name, by class name.
        custom_objects: As for `keras.models.load_model`; these win over
            `custom_optimizers` of the same name.
        compression: The gradient compression of the optimizer:
            `Compression.none`, `.fp16` or `.bf16`.
        legacy_opts: Horovod's switch for Keras 2's legacy optimizers, which
            Keras 3 does not have: only False is accepted.

    Returns:
        The `keras.Model`, its optimizer (if it was saved with one)
        averaging gradients over all processes.

    Raises:
        UsageError: If `legacy_opts` is True.
    """
    if legacy_opts:
        raise UsageError("load_model: Keras 3 has no legacy optimizers (legacy_opts=True)")
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    if model.optimizer is not None:
        make_distributed(model.optimizer, GradientReducer(compression=compression))
    return model
