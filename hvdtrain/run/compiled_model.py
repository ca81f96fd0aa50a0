"""A recipe's model compiled as a run's settings say: the optimizer by its
Keras name with the knobs Keras users know, made distributed, and XLA where
asked. The trainer and `hvdtrain evaluate` build the same model this way, so
that a checkpoint's variables fit either."""

import horovod.tensorflow as hvd
import keras
from absl import logging

from hvdtrain import layout
from hvdtrain.config import CLIPPING, OPTIMIZERS
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives, pipeline_parallel, split_variables
from hvdtrain.parallel.data_parallel.compression import Compression
from hvdtrain.parallel.data_parallel.evaluation import EmptyBatchesStep
from hvdtrain.parallel.data_parallel.optimizer import DistributedOptimizer
from hvdtrain.run import executions, xla

__all__ = ["build", "compile_model", "keras_optimizer"]


def build(recipe, config):
    """The recipe's model for `config`, compiled (`compile_model`): with
    --pipeline_parallel, a `hvdtrain.pipeline.Pipeline` of its stages. Call
    it on every rank.

    Raises:
        UsageError: On every rank, if `build_model` returned no Keras model
            on some rank, or models that differ between ranks (a model that
            depends on the rank: Horovod's broadcast of the weights would
            fail on their shapes).
    """
    model = error = None
    try:
        if config.pipeline_parallel > 1:
            # Each rank gives values to its stage's weights only (Pipeline).
            with pipeline_parallel.deferred():
                model = recipe.make_model(config)
        else:
            model = recipe.make_model(config)
    except UsageError as e:
        error = e
    collectives.raise_together(error)
    _check_the_same_on_every_rank(model, recipe.name)
    _warn_of_nothing_split(model, recipe.name)
    if config.pipeline_parallel > 1:
        model = _pipelined(model, config)
    return compile_model(model, recipe, config)


def _pipelined(model, config):
    """`model` cut into --pipeline_parallel stages (at --pipeline_cuts, or
    where its parameters split most evenly), this rank's stage run by a
    Pipeline of --microbatches."""
    stages = pipeline_parallel.cut(model, at=config.pipeline_cut_points() or None,
                                   stages=config.pipeline_parallel)
    microbatches = config.pipeline_microbatches()
    costly = pipeline_parallel.few_microbatches(config.pipeline_parallel, microbatches)
    if costly and hvd.rank() == 0:
        logging.warning("--microbatches: %s", costly)
    return pipeline_parallel.Pipeline(stages, microbatches, config.pipeline_schedule,
                                      name=f"{model.name}_pipeline")


def _warn_of_nothing_split(model, recipe_name):
    """With tensor parallelism, a model without split layers has each of a
    replica's ranks do the same work: worth a word, once."""
    if layout.tensor_size() == 1 or split_variables.has_shards(model) or hvd.rank() != 0:
        return
    logging.warning("--tensor_parallel=%d: recipe %s's model has no tensor-parallel layers "
                    "(hvdtrain.layers: ColumnParallelDense, RowParallelDense, "
                    "ParallelMultiHeadAttention, VocabParallelEmbedding), so the %d ranks of each "
                    "replica do the same work; drop --tensor_parallel to train data-parallel on "
                    "every worker", layout.tensor_size(), recipe_name, layout.tensor_size())


def _check_the_same_on_every_rank(model, recipe_name):
    if hvd.size() == 1:
        return
    layouts = hvd.allgather_object(
        [(v.path, tuple(split_variables.logical_shape(v)), str(v.dtype)) for v in model.weights],
        name="hvdtrain.model_layout")
    for rank, theirs in enumerate(layouts):
        if theirs != layouts[0]:
            raise UsageError(f"recipe {recipe_name} builds different models on ranks 0 and "
                             f"{rank} ({_difference(layouts[0], theirs, rank)}); build_model "
                             "must build the same model on every rank, from the config alone")


def _difference(first, other, rank):
    """The first variable in which two ranks' models differ, in words."""
    for mine, theirs in zip(first, other):
        if mine != theirs:
            return (f"{mine[0]} {list(mine[1])} {mine[2]} on rank 0, "
                    f"{theirs[0]} {list(theirs[1])} {theirs[2]} on rank {rank}")
    return f"{len(first)} variables on rank 0, {len(other)} on rank {rank}"


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
        `model`, compiled with a `DistributedOptimizer` that reduces over
        the data-parallel replicas, whose rate is `config.learning_rate`
        scaled by their number (the workers', without tensor parallelism),
        whose train function runs `config.steps_per_execution` steps per
        call (run/executions.py). The trainer has the step warm the rate
        up and schedule it (run/learning_rate.py).
    """
    optimizer = DistributedOptimizer(
        keras_optimizer(config, config.learning_rate * layout.data_size()),
        compression=getattr(Compression, config.compression),
        sparse_as_dense=config.sparse_as_dense,
        groups="auto" if config.allreduce_groups is None else config.allreduce_groups or None,
        backward_passes_per_step=config.backward_passes_per_step,
        average_aggregated_gradients=True, process_set=layout.data_set())
    # A Metric class is made here: made at import, its variables would start
    # TensorFlow before runtime.init sets its threads.
    metrics = [m() if isinstance(m, type) else m for m in recipe.metrics]
    # XLA cannot hold Horovod's collectives (Keras would pick it on GPUs):
    # --jit_compile compiles the rest of the step.
    model.compile(optimizer=optimizer, loss=recipe.loss, metrics=metrics, jit_compile=False)
    EmptyBatchesStep.install(model)   # a shard's end, in validation and evaluation
    executions.Executions(model, config.steps_per_execution)
    if config.jit_compile:
        xla.jit_compile(model)
    return model
