"""A recipe's model compiled as a run's settings say: the optimizer by its
Keras name with the knobs Keras users know, made distributed, and XLA where
asked. The trainer and `hvdtrain evaluate` build the same model this way, so
that a checkpoint's variables fit either."""

import horovod.tensorflow as hvd
import keras

from hvdtrain.config import CLIPPING, OPTIMIZERS
from hvdtrain.parallel.data.compression import Compression
from hvdtrain.parallel.data.optimizer import DistributedOptimizer
from hvdtrain.run import xla

__all__ = ["compile_model", "keras_optimizer"]


def keras_optimizer(config, learning_rate):
    """The keras.optimizers optimizer that `config.optimizer` names.

    Args:
        config: The run's `TrainConfig`: its optimizer, momentum, nesterov,
            weight decay, clipping and EMA settings; unset ones keep
            Keras's defaults.
        learning_rate: The rate to start from (scaled for the workers).

    Returns:
        A new, unbuilt Keras optimizer.
    """
    optimizer = OPTIMIZERS[config.optimizer]
    arguments = optimizer.arguments(config)
    for name in (*CLIPPING, "weight_decay"):
        if getattr(config, name) is not None:
            arguments[name] = getattr(config, name)
    if config.ema_momentum is not None:
        arguments.update(use_ema=True, ema_momentum=config.ema_momentum)
    return getattr(keras.optimizers, optimizer.keras_class)(learning_rate, **arguments)


def compile_model(model, recipe, config):
    """Compiles `model` (the recipe's, unbuilt or built) for data-parallel
    training with `config`'s optimizer, reduction and XLA settings.

    Returns:
        `model`, compiled with a `DistributedOptimizer` whose rate is
        `config.learning_rate` scaled by the number of workers.
    """
    optimizer = DistributedOptimizer(
        keras_optimizer(config, config.learning_rate * hvd.size()),
        compression=getattr(Compression, config.compression),
        sparse_as_dense=config.sparse_as_dense,
        groups=config.allreduce_groups or None,
        backward_passes_per_step=config.backward_passes_per_step,
        average_aggregated_gradients=True)
    # A Metric class is made here: made at import, its variables would start
    # TensorFlow before runtime.init sets its threads.
    metrics = [m() if isinstance(m, type) else m for m in recipe.metrics]
    # XLA cannot hold Horovod's collectives (Keras would pick it on GPUs):
    # --jit_compile compiles the rest of the step.
    model.compile(optimizer=optimizer, loss=recipe.loss, metrics=metrics, jit_compile=False)
    if config.jit_compile:
        xla.jit_compile(model)
    return model
