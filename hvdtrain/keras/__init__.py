"""Horovod's `horovod.tensorflow.keras` API on Keras 3, for scripts written
against it:

    import hvdtrain.keras as hvd        # was: import horovod.tensorflow.keras as hvd

The same names and signatures, backed by hvdtrain's Keras 3 optimizer and
callbacks and by Horovod's TensorFlow collectives. Differences: `init()` also
pins the GPU and sizes the thread pools (see hvdtrain.runtime); Keras 3 has
no global variables, so `broadcast_global_variables` refuses (use
`broadcast_variables` or `callbacks.BroadcastGlobalVariablesCallback`).
`elastic` holds KerasState and the elastic callbacks for Keras 3.
"""

import keras
import tensorflow as tf
from horovod.tensorflow import (  # noqa: F401  (re-exported as Horovod's keras module does)
    Adasum, Average, ProcessSet, Sum, add_process_set, ccl_built, cross_rank, cross_size,
    cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
    remove_process_set, rocm_built, shutdown, size, start_timeline, stop_timeline)

import horovod.tensorflow as _hvd
from hvdtrain import runtime
from hvdtrain.collectives import broadcast_variables, root_name_scope  # noqa: F401
from hvdtrain.compression import BF16Compressor, Compression
from hvdtrain.errors import UsageError
from hvdtrain.keras import callbacks, elastic  # noqa: F401
from hvdtrain.optimizer import (  # noqa: F401
    DistributedOptimizer, PartialDistributedOptimizer, make_distributed)
from hvdtrain.reduction import GradientReducer


def init(comm=None, process_sets=None):
    """Horovod's `init`, then this process's GPU and thread set-up."""
    runtime.init(process_sets=process_sets, comm=comm)


def broadcast_global_variables(root_rank):
    """Horovod's TF1 global-variable broadcast, which Keras 3 has no use for."""
    raise UsageError("broadcast_global_variables: Keras 3 has no global variables; use "
                     "hvd.broadcast_variables(model.variables, root_rank) or "
                     "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)")


# The collectives take anything convertible to a tensor and, like Horovod's
# under TensorFlow 2, return eager tensors (`.numpy()`, `np.asarray`). Inside
# a tf.function an unnamed one would be named after its tensor, whose name
# can differ between ranks: it gets a fixed name at the graph's top level,
# made unique by the order of the calls (see hvdtrain.reduction).

def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Reduces `value` over all ranks (Average unless `op` says otherwise)."""
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
    """Concatenates every rank's `value` along the first dimension."""
    with root_name_scope():
        return _hvd.allgather(tf.convert_to_tensor(value), name=name or "hvdtrain.allgather",
                              ignore_name_scope=True)


def broadcast(value, root_rank, name=None):
    """`root_rank`'s `value`, on every rank."""
    with root_name_scope():
        return _hvd.broadcast(tf.convert_to_tensor(value), root_rank,
                              name=name or "hvdtrain.broadcast", ignore_name_scope=True)


def reducescatter(value, name=None, op=Average):
    """Reduces `value` over all ranks and gives each its slice of the first dimension."""
    with root_name_scope():
        return _hvd.reducescatter(tf.convert_to_tensor(value), op=op,
                                  name=name or "hvdtrain.reducescatter", ignore_name_scope=True)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Loads a `.keras` model and makes its optimizer distributed, keeping the
    state it was saved with (slots, iterations), as Horovod's does.

    `custom_optimizers`: optimizer classes the file may name (by class name).
    """
    if legacy_opts:
        raise UsageError("load_model: Keras 3 has no legacy optimizers (legacy_opts=True)")
    objects = {cls.__name__: cls for cls in custom_optimizers or ()}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    if model.optimizer is not None:
        make_distributed(model.optimizer, GradientReducer(compression=compression))
    return model
