"""One training run, in the order data flows: config -> runtime -> data ->
model and optimizer -> fit with callbacks -> rank 0's files."""

import dataclasses
import pathlib
import sys
import time

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from absl import logging

from hvdtrain import callbacks, checkpoint, runtime
from hvdtrain import recipe as recipe_lib
from hvdtrain.compression import Compression
from hvdtrain.errors import UsageError
from hvdtrain.evaluation import ExactEvaluation
from hvdtrain.optimizer import DistributedOptimizer

_MARK = "hvdtrain: "
COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16, "bf16": Compression.bf16}


@dataclasses.dataclass(frozen=True)
class TrainResult:
    model: keras.Model
    history: dict               # per-epoch metrics, averaged over the workers
    model_path: pathlib.Path    # the final model (written by rank 0)
    seconds: float


def train(config):
    """Trains `config.recipe` data-parallel on all Horovod processes."""
    config.validate()
    recipe = recipe_lib.get(config.recipe)
    runtime.init(config.intra_op_threads, config.inter_op_threads, precision=config.precision)
    keras.utils.set_random_seed(config.seed)

    splits = recipe.load_data(config)
    train_data, validation_data = splits.train, splits.validation
    logging.info("%d workers x batch %d = global batch %d; %d steps per epoch; "
                 "%d of %d training examples left out each epoch",
                 hvd.size(), config.batch_size, hvd.size() * config.batch_size,
                 train_data.steps, train_data.dropped, train_data.examples)

    model = recipe.build_model(config)
    learning_rate = config.learning_rate * hvd.size()
    optimizer = DistributedOptimizer(
        _optimizer(config, learning_rate), compression=COMPRESSIONS[config.compression],
        sparse_as_dense=config.sparse_as_dense,
        backward_passes_per_step=config.backward_passes_per_step,
        average_aggregated_gradients=True)
    # XLA cannot hold Horovod's collectives; Keras would pick it on GPUs.
    model.compile(optimizer=optimizer, loss=recipe.loss, metrics=list(recipe.metrics),
                  jit_compile=False)

    model_dir = pathlib.Path(config.model_dir or pathlib.Path("runs", recipe.name))
    fit_callbacks = [
        callbacks.BroadcastGlobalVariablesCallback(root_rank=0),
        # Validation metrics: exact over the whole split.
        ExactEvaluation(validation_data.steps),
        # Training metrics: averaged, before everything that reads them.
        callbacks.MetricAverageCallback(),
    ]
    if config.warmup_epochs:
        fit_callbacks.append(callbacks.LearningRateWarmupCallback(
            learning_rate, config.warmup_epochs, steps_per_epoch=train_data.steps))
    if runtime.is_main_process():
        fit_callbacks.append(checkpoint.EpochCheckpoint(model_dir / "checkpoint.keras"))

    start = time.perf_counter()
    try:
        history = model.fit(train_data.for_epochs(config.epochs), epochs=config.epochs,
                            steps_per_epoch=train_data.steps,
                            validation_data=validation_data.batches(),
                            callbacks=fit_callbacks, verbose=_verbosity(config),
                            shuffle=False)  # the pipeline shuffles
    except tf.errors.InvalidArgumentError as e:
        # Checks inside input pipelines (e.g. image sizes) carry hvdtrain's message.
        if _MARK not in e.message:
            raise
        raise UsageError(e.message.split(_MARK, 1)[1].splitlines()[0]) from None
    seconds = time.perf_counter() - start
    model_path = model_dir / "model.keras"
    if runtime.is_main_process():
        checkpoint.save_model(model, model_path)
    return TrainResult(model, history.history, model_path, seconds)


def _optimizer(config, learning_rate):
    if config.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate)
    return keras.optimizers.SGD(learning_rate, momentum=config.momentum)


def _verbosity(config):
    if not runtime.is_main_process():
        return 0
    if config.verbose is not None:
        return config.verbose
    # Launchers pipe every rank's output through prefixed lines: no bars there.
    return 1 if sys.stdout.isatty() and runtime.size() == 1 else 2
