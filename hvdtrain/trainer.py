"""One training run, in the order data flows: config -> runtime -> data ->
model and optimizer -> checkpoint to resume from -> fit with callbacks ->
rank 0's exports."""

import dataclasses
import pathlib
import sys
import time

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from absl import logging

from hvdtrain import callbacks, export, resume, runtime
from hvdtrain import recipe as recipe_lib
from hvdtrain.compression import Compression
from hvdtrain.errors import UsageError
from hvdtrain.evaluation import ExactEvaluation
from hvdtrain.optimizer import DistributedOptimizer
from hvdtrain.watchdog import StallWatchdog

_MARK = "hvdtrain: "
COMPRESSIONS = {"none": Compression.none, "fp16": Compression.fp16, "bf16": Compression.bf16}


@dataclasses.dataclass(frozen=True)
class TrainResult:
    model: keras.Model
    history: dict               # per-epoch metrics, averaged over the workers
    model_path: pathlib.Path    # the final model, .keras (written by rank 0)
    saved_model: pathlib.Path   # the same as a SavedModel for serving
    seconds: float
    start: tuple                # (epoch, step) training started from
    checkpoint_seconds: list    # each checkpoint's save time (rank 0)


def train(config):
    """Trains `config.recipe` data-parallel on all Horovod processes."""
    config.validate()
    recipe = recipe_lib.get(config.recipe)
    runtime.init(config.intra_op_threads, config.inter_op_threads, precision=config.precision,
                 stall_timeout=config.stall_timeout)
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
    checkpoints = model_dir / "checkpoints"
    if config.resume:
        epoch, step = resume.restore(model, checkpoints, config, train_data.steps)
        if epoch + step / train_data.steps >= config.warmup_epochs:
            # Past warm-up nothing sets the rate again: scale it for the workers there are now.
            optimizer.learning_rate = learning_rate
    else:
        resume.refuse_to_overwrite(checkpoints)
        epoch, step = 0, 0

    fit_callbacks = [
        callbacks.BroadcastGlobalVariablesCallback(root_rank=0),
        # Validation metrics: exact over the whole split.
        ExactEvaluation(validation_data.steps),
        # Training metrics: averaged, before everything that reads them.
        callbacks.MetricAverageCallback(),
    ]
    if config.nan_policy == "fail":
        fit_callbacks.append(callbacks.FailOnNonFiniteLoss())
    if config.warmup_epochs:
        fit_callbacks.append(callbacks.LearningRateWarmupCallback(
            learning_rate, config.warmup_epochs, steps_per_epoch=train_data.steps))
    saver = resume.PeriodicCheckpoint(
        checkpoints, dataclasses.asdict(config), train_data.steps, config.batch_size,
        config.epochs, every_epochs=config.checkpoint_epochs,
        every_steps=config.checkpoint_steps, keep=config.keep_checkpoints,
        monitor=config.best_metric or None, nan_policy=config.nan_policy)
    fit_callbacks.append(saver)
    if config.stall_timeout:
        # After Horovod's stall check (set to stall_timeout), where that can act.
        fit_callbacks.append(StallWatchdog(2 * config.stall_timeout))

    start = time.perf_counter()
    try:
        history = _fit(model, train_data, validation_data, fit_callbacks, config, epoch, step)
    except tf.errors.InvalidArgumentError as e:
        # Checks inside input pipelines (e.g. image sizes) carry hvdtrain's message.
        if _MARK not in e.message:
            raise
        raise UsageError(e.message.split(_MARK, 1)[1].splitlines()[0]) from None
    seconds = time.perf_counter() - start
    model_path, saved_model = model_dir / export.KERAS_FILE, model_dir / export.SAVED_MODEL_DIR
    if runtime.is_main_process():
        export.export(model, model_dir)
    return TrainResult(model, history, model_path, saved_model, seconds, (epoch, step),
                       saver.seconds)


def _fit(model, data, validation, fit_callbacks, config, epoch, step):
    """Trains from batch `step` of `epoch` to the end; returns the history."""
    common = dict(validation_data=validation.batches(), verbose=_verbosity(config),
                  shuffle=False)  # the pipeline shuffles
    histories = []
    if step:
        # The rest of an epoch a checkpoint cut: its own fit, shown to the
        # callbacks as the whole epoch.
        histories.append(model.fit(
            data.rest_of_epoch(epoch, step), epochs=epoch + 1, initial_epoch=epoch,
            steps_per_epoch=data.steps - step,
            callbacks=[resume.ContinuedEpoch(c, step) for c in fit_callbacks], **common))
        epoch += 1
    if epoch < config.epochs:
        histories.append(model.fit(
            data.for_epochs(config.epochs, epoch), epochs=config.epochs, initial_epoch=epoch,
            steps_per_epoch=data.steps, callbacks=fit_callbacks, **common))
    merged = {}
    for history in histories:
        for name, values in history.history.items():
            merged.setdefault(name, []).extend(values)
    return merged


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
