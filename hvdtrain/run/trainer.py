"""One training run, in the order data flows: config -> runtime -> data ->
model and optimizer -> checkpoint to resume from -> fit with callbacks ->
rank 0's exports."""

import dataclasses
import math
import pathlib
import sys
import typing

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from absl import logging

from hvdtrain import callbacks, layout, lr_schedules, runtime
from hvdtrain import recipe as recipe_lib
from hvdtrain.data import input_errors
from hvdtrain.errors import TrainingError, UsageError
from hvdtrain.faults import preemption, watchdog
from hvdtrain.parallel import collectives, split_variables
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib
from hvdtrain.parallel.data_parallel import statistics
from hvdtrain.run import compiled_model, executions, fit, learning_rate
from hvdtrain.state import checkpoint, elastic_state, export, run_lock, training_state, whole_state
from hvdtrain.state.model_dir import DEFAULT_PARENT, check_usable
from hvdtrain.state.training_state import Position
from hvdtrain.tools import flops, throughput

__all__ = ["TrainResult", "stop_vote", "train"]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What `train` returns, on every rank.

    Of the run, or under elastic mode of its last (re)start: the model and
    its files are the whole run's, the rest is from that start on.

    Attributes:
        model: The trained `keras.Model`.
        history: `{metric: [value per epoch]}`, averaged over the workers.
        model_path: The final model, `.keras` (written by rank 0 when
            `config.export` is set).
        saved_model: The same as a SavedModel for serving.
        seconds: The training time, from the start of `fit` to its end.
        start: `(epoch, step)` training started from.
        checkpoint_seconds: Each checkpoint's save time (rank 0; empty on
            the other ranks).
        throughput: A `hvdtrain.tools.throughput.Measurement` of examples per
            second; None: too few steps to time.
    """
    model: keras.Model
    history: dict
    model_path: pathlib.Path
    saved_model: pathlib.Path
    seconds: float
    start: tuple
    checkpoint_seconds: list
    throughput: throughput.Measurement | None


def train(config):
    """Trains `config.recipe` data-parallel on all Horovod processes.

    Call it on every process; it calls `hvdtrain.init` itself. Started by
    horovodrun in elastic mode, it trains on the workers there are: when
    they change, training goes on from the last commit on the new ones.

    Args:
        config: A `hvdtrain.TrainConfig` (e.g. from `hvdtrain.recipe.make_config`).

    Returns:
        A `TrainResult`.

    Raises:
        UsageError: If the settings, the recipe, the model directory (in
            use by another run, or holding checkpoints without
            `config.resume`), the checkpoint to resume from or the data are
            not usable; the message says how to fix it.
        TrainingError: If training cannot go on: a loss that is not finite
            (`config.nan_policy="fail"`), a checkpoint that cannot be
            written, or weights that are not finite at the end.
        hvdtrain.faults.preemption.Preempted: On every rank, when a signal of
            `config.preemption_signals` (or the launcher's exit) stopped
            training after a checkpoint of where it stands. Those signals
            are then ignored, for the process to exit with its own status.
    """
    config.validate()
    recipe = recipe_lib.get(config.recipe)
    model_dir = pathlib.Path(config.model_dir or DEFAULT_PARENT / recipe.name)
    check_usable(model_dir)
    runtime.init(config.intra_op_threads, config.inter_op_threads, precision=config.precision,
                 stall_timeout=config.stall_timeout, timeline=bool(config.timeline_steps),
                 verbose_all_ranks=config.verbose_all_ranks,
                 tensor_parallel=config.tensor_parallel,
                 pipeline_parallel=config.pipeline_parallel, mpi_wait=config.mpi_wait)
    if _stops_cleanly(config):
        preemption.install(preemption.parse_signals(config.preemption_signals))
    try:
        result = _train(config, recipe, model_dir)
        # No rank leaves while another still needs it in a collective (the
        # export's gather): its exit would shut Horovod down under them.
        runtime.leave_together()
        return result
    except preemption.Preempted:
        # The launcher signals the ranks still exiting once the first has:
        # that must not turn their status into a death by signal.
        preemption.ignore_further()
        raise
    finally:
        preemption.uninstall()
        run_lock.release(model_dir)
        runtime.stop_watching()


def _stops_cleanly(config):
    """Whether a signal stops this run with a checkpoint: there are
    checkpoints, and it is not elastic (where a signalled worker is lost)."""
    return bool(config.preemption_signals and config.keep_checkpoints
                and not elastic_state.launched())


def _train(config, recipe, model_dir):
    keras.utils.set_random_seed(config.seed)
    watchdog.progress("building the model")
    model = compiled_model.build(recipe, config)
    learning_rate.set_up(model.optimizer, config)

    if elastic_state.launched():
        if (split_variables.has_shards(model) or layout.tensor_size() > 1
                or layout.pipeline_size() > 1):
            raise UsageError("elastic mode cannot reshard weights split across workers "
                             "(ShardedEmbedding, tensor-parallel layers, pipeline stages) when "
                             "workers come and go; run with a fixed -np, --resume reshards them "
                             "at another number of workers")
        state = elastic_state.KerasState(model, position=None, kept_states={})
        result = elastic_state.run(_train_from)(state, model, recipe, config, model_dir)
    else:
        vote = stop_vote(model) if preemption.handling() else None
        result = _train_from(None, model, recipe, config, model_dir, vote)
    # The weights' moving average (--ema_momentum) becomes the model: what
    # was validated is what is exported (Keras's fit does this at its end;
    # a run here may take several fits, or none when resumed at its end).
    model.optimizer.finalize_variable_values(model.trainable_weights)
    statistics.average_statistics(model)   # what validation and the checkpoints saw
    _refuse_non_finite(model, model_dir)
    if config.export:
        watchdog.progress("exporting the model")
        # Split weights become whole, and a pipeline's stages one model.
        exported = whole_state.plain_model(model)
        if runtime.is_main_process():
            export.export(exported, model_dir)
    return result


def stop_vote(model):
    """A `callbacks.StopVote` that `model`'s train step exchanges with its
    gradients and carries out of each call of its train function
    (run/executions.py). Before the first step: the step is traced then."""
    vote = callbacks.StopVote()
    optimizer_lib.add_step_exchange(model.optimizer, vote.exchange)
    vote.outcome = executions.of(model).read_at_each_call_end("hvdtrain.stop_vote",
                                                              vote.agreed.value)
    return vote


def _refuse_non_finite(model, model_dir):
    """Ends the run, on every rank, when training left weights that are not
    finite (possible with --nan_policy=ignore): such a model is not trained,
    and is not written over anything."""
    finite = checkpoint.all_finite([keras.ops.convert_to_numpy(v) for v in model.weights])
    if collectives.agree_on_min(int(finite), name="hvdtrain.finite_weights"):
        return
    raise TrainingError(f"training ended with weights that are not finite (NaN or infinite): "
                        "no model written; lower --learning_rate or check the data, then "
                        f"resume from the last checkpoint in {model_dir / 'checkpoints'}")


def _train_from(state, model, recipe, config, model_dir, vote=None):
    """Trains `model` to the last epoch from where the run stands; returns
    the TrainResult of this start. With a `callbacks.StopVote` (in the
    optimizer's step), a stop request ends it with a checkpoint.

    Without `state` (not elastic) it runs once. Under horovodrun's elastic
    mode it runs again on every restart (`state`: the model's
    elastic_state.KerasState, set to the last commit on every worker), so all that
    depends on the workers is made here: the data's shards and steps, the
    scaled learning rate, the callbacks (warm-up, checkpoints).
    """
    # Sharded by the current rank and size, with the steps agreed between them.
    watchdog.progress("loading data")
    splits = recipe.make_splits(config)
    train_data, validation_data = splits.train, splits.validation
    steps = train_data.steps
    replicas = layout.data_size()
    split = replicas < hvd.size()
    if split:
        logging.info("%d workers = %d data-parallel replicas x %d tensor-parallel ranks x %d "
                     "pipeline stages", hvd.size(), replicas, layout.tensor_size(),
                     layout.pipeline_size())
    logging.info("%d %s x batch %d = global batch %d; %d steps per epoch; "
                 "%d of %d training examples left out each epoch",
                 replicas, "replicas" if split else "workers",
                 config.batch_size, replicas * config.batch_size,
                 steps, train_data.dropped, train_data.examples)

    checkpoints = model_dir / "checkpoints"
    restarted = state is not None and state.position is not None
    watchdog.progress("finding where to start")
    start = _starting_point(state, model, config, checkpoints, steps)
    epoch, step = start.epoch, start.step
    learning_rate.stand_at(model.optimizer, config, epoch * steps + step, steps, replicas)
    _check_watched_metric(config, validation_data)
    _check_step_windows(config, steps, epoch * steps + step)
    started = _callbacks(state, vote, config, model_dir, steps,
                         validation_data.steps if validation_data else None,
                         start=(epoch, step), resumed=config.resume or restarted,
                         kept_states=start.kept_states)
    stopped = callbacks.EarlyStopping.stopped_after(start.kept_states)
    if stopped is not None:
        logging.info("training stopped early after epoch %d (--early_stopping_patience): "
                     "nothing left to train", stopped)
        epoch, step = config.epochs, 0
    try:
        history = fit.from_position(model, train_data, validation_data, started.ordered,
                                    epochs=config.epochs, epoch=epoch, step=step,
                                    verbose=_verbosity(config))
    except tf.errors.OpError as e:
        # Bad data found while training (a corrupt file, a record that does not parse).
        error = input_errors.usage_error(e, train_data, validation_data)
        if error is None:
            raise
        raise error from None
    except preemption.Preempted:
        _close_summaries(started.ordered)
        raise
    measurement = started.meter.run_measurement
    if runtime.is_main_process():
        throughput.log(measurement, recipe.unit)
        if measurement is not None and recipe.tokens_per_example is not None:
            logging.info("throughput: %s", flops.describe(
                measurement.total.mean * recipe.tokens_per_example(config),
                _parameters(model), hvd.size(), runtime.device_name(), config.precision))
    return TrainResult(model, history, model_dir / export.KERAS_FILE,
                       model_dir / export.SAVED_MODEL_DIR, started.meter.seconds, (epoch, step),
                       started.saver.seconds if started.saver else [],
                       measurement)


def _parameters(model):
    """The whole model's trainable parameters (of every part of split
    weights, and every stage of a pipeline)."""
    whole = getattr(model, "whole", model)
    return sum(math.prod(split_variables.logical_shape(v)) for v in whole.trainable_weights)


def _close_summaries(ordered):
    """Writes out the TensorBoard summaries held in memory: fit closes the
    writers at its end, which a stop on request skips."""
    for callback in ordered:
        if isinstance(callback, callbacks.EpochTensorBoard):
            callback.on_train_end()


class _Start(typing.NamedTuple):
    epoch: int              # where this start trains from (0-based)
    step: int
    workers: int | None     # the workers of the state it goes on from (None: a new run)
    kept_states: dict       # callbacks.KeptState's states there


def _starting_point(state, model, config, checkpoints, steps):
    """Where this start trains from: a _Start."""
    if state is not None and state.position is not None:
        # An elastic restart: counted in examples, as when resuming a
        # checkpoint on other workers.
        committed = state.position
        epoch, step = training_state.continue_at(committed, steps, hvd.size(),
                                                 config.batch_size)
        logging.info("elastic restart, world size %d -> %d: from the commit after %s, "
                     "going on after %s", committed.workers, hvd.size(), committed.describe(),
                     Position(epoch, step, steps, hvd.size(), config.batch_size).describe())
        return _Start(epoch, step, committed.workers, state.kept_states)
    # The run's first start (elastic: every worker is here, none has committed yet).
    run_lock.acquire(checkpoints.parent)
    if config.resume:
        epoch, step, workers, kept = checkpoint.restore(model, checkpoints, config, steps)
    else:
        checkpoint.refuse_to_overwrite(checkpoints)
        epoch, step, workers, kept = 0, 0, None, {}
    if state is not None:
        # Commit the start, with rank 0's variables (a checkpoint restored
        # there) on every worker: a restart must not look for checkpoints
        # again, it would find this run's own.
        collectives.broadcast_variables(training_state.training_variables(model))
        state.position = Position(epoch, step, steps, hvd.size(), config.batch_size)
        state.kept_states = kept
        state.commit()
    return _Start(epoch, step, workers, kept)


def _check_watched_metric(config, validation_data):
    """Early stopping and the plateau schedule need the metric they watch:
    a validation metric needs validation data."""
    watching = config.early_stopping_patience or config.lr_schedule == lr_schedules.PLATEAU
    if watching and config.best_metric.startswith("val_") and validation_data is None:
        raise UsageError(f"--best_metric={config.best_metric} is a validation metric, and "
                         f"recipe {config.recipe} has no validation data: watch a training "
                         f"metric (e.g. --best_metric={config.best_metric.removeprefix('val_')})")


def _check_step_windows(config, steps, done):
    """A window of --timeline_steps or --profile_steps must hold steps this
    run trains: past its last one nothing would be recorded."""
    last = config.epochs * steps
    for name, window in (("timeline_steps", config.timeline_window()),
                         ("profile_steps", config.profile_window())):
        if window is None:
            continue
        if window[0] > last:
            raise UsageError(f"--{name}={getattr(config, name)} starts after the run's last "
                             f"step, {last} ({config.epochs} epochs of {steps}): choose steps "
                             f"up to {last}")
        if window[1] <= done:
            logging.warning("--%s=%s: the run goes on after step %d, so nothing is recorded",
                            name, getattr(config, name), done)


class _StartCallbacks(typing.NamedTuple):
    ordered: list                   # every callback, in callbacks.ORDER
    meter: callbacks.Throughput
    saver: callbacks.PeriodicCheckpoint | None


def _callbacks(state, vote, config, model_dir, steps, validation_steps, start, resumed,
               kept_states=None):
    """The callbacks of one start from `start` (epoch, step), in the order
    they must run, with its throughput meter and checkpoint saver;
    `kept_states`: the states of those that keep one (callbacks.KeptState),
    where the run stands."""
    kept_states = kept_states or {}
    # The ranks of a replica share its batch: each counts its share.
    meter = callbacks.Throughput(config.batch_size * layout.data_size() / hvd.size(),
                                 config.throughput_warmup_steps, config.throughput_window_steps)
    chosen = [meter, callbacks.WatchdogProgress(), callbacks.BroadcastInitialState(root_rank=0),
              callbacks.AverageMetrics(),
              callbacks.RunLog(model_dir, meter, config, start, resumed)]
    if validation_steps:
        chosen.append(callbacks.ExactEvaluation(validation_steps))
        if config.ema_momentum is not None:
            chosen.append(callbacks.AverageWeightsForEvaluation())
    if config.nan_policy == "fail":
        chosen.append(callbacks.FailOnNonFiniteLoss())
    chosen.append(callbacks.LearningRateLog())
    if config.lr_schedule == lr_schedules.PLATEAU:
        chosen.append(callbacks.PlateauLearningRate(
            config.best_metric, config.plateau_factor, config.plateau_patience,
            config.warmup_epochs, state=kept_states.get(callbacks.PlateauLearningRate.state_key)))
    if config.early_stopping_patience:
        chosen.append(callbacks.EarlyStopping(
            config.best_metric, config.early_stopping_patience,
            config.early_stopping_min_delta,
            state=kept_states.get(callbacks.EarlyStopping.state_key)))
    kept = [c for c in chosen if isinstance(c, callbacks.KeptState)]
    saver = None
    if config.keep_checkpoints:
        saver = callbacks.PeriodicCheckpoint(
            model_dir / "checkpoints", config.recorded(), config.batch_size,
            config.epochs, every_epochs=config.checkpoint_epochs,
            every_steps=config.checkpoint_steps, keep=config.keep_checkpoints,
            monitor=config.best_metric or None, nan_policy=config.nan_policy, kept=kept)
        chosen.append(saver)
        if vote is not None:
            chosen.append(callbacks.PreemptionStop(vote, saver, config.batch_size,
                                                   config.epochs, start))
    if runtime.is_main_process():
        chosen.append(callbacks.EpochTensorBoard(model_dir / "tensorboard", write_graph=False))
        if config.profile_steps:
            # Beside the metrics of the same run, where TensorBoard's profile tab finds it.
            chosen.append(callbacks.ProfilerWindow(model_dir / "tensorboard" / "train",
                                                   *config.profile_window()))
    if config.timeline_steps:
        first, last = config.timeline_window()
        chosen.append(callbacks.HorovodTimeline(model_dir / "timeline.json", first, last))
    if state is not None:
        chosen += [callbacks.TrackPosition(state, config.batch_size, kept=kept),
                   callbacks.CommitState(state, config.elastic_commit_steps)]
    return _StartCallbacks(callbacks.in_order(chosen), meter, saver)


def _verbosity(config):
    if not runtime.is_main_process():
        return 2 if config.verbose_all_ranks else 0
    if config.verbose is not None:
        return config.verbose
    # Launchers pipe every rank's output through prefixed lines: no bars there.
    return 1 if sys.stdout.isatty() and runtime.size() == 1 else 2
