"""`hvdtrain evaluate`: a trained model, or one of its run's checkpoints,
evaluated on a split of its recipe's data by every worker, each example
counted once.

Rank 0 reads what is evaluated (the exported `model.keras`, or a checkpoint)
and the settings of the run that made it (the checkpoint's, or the run log's
start), and every rank builds the recipe's model as that run did; rank 0's
weights reach the others by a broadcast, so the model directory need not be
shared between hosts. A checkpoint of a run with --ema_momentum is evaluated
on its moving averages, as its validation was. The metrics are exact over
the whole split, as validation's are (callbacks.ExactEvaluation): evaluating
the validation split gives what training reported for the same weights.
"""

import dataclasses
import json
import pathlib

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain import layout, runtime
from hvdtrain import recipe as recipe_lib
from hvdtrain.callbacks import ExactEvaluation
from hvdtrain.config import TrainConfig
from hvdtrain.data import input_errors
from hvdtrain.errors import TrainingError, UsageError
from hvdtrain.faults import watchdog
from hvdtrain.parallel import collectives, split_variables
from hvdtrain.run import compiled_model
from hvdtrain.state import atomic_files, checkpoint, export, training_state, whole_state
from hvdtrain.state import model_dir as model_dir_lib
from hvdtrain.tools import run_log

__all__ = ["Evaluation", "VALIDATION", "describe", "evaluate"]

VALIDATION = "validation"   # the split training validates on (Recipe.load_data)
# The settings evaluating may change; the others (the model, the optimizer,
# the precision) are the run's own.
CHANGEABLE = ("batch_size", "data_dir", "intra_op_threads", "inter_op_threads", "mpi_wait",
              "model_dir", "pipeline_parallel", "microbatches", "pipeline_schedule",
              "tensor_parallel", "verbose_all_ranks")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What `evaluate` returns, on every rank.

    Attributes:
        source: What was evaluated: the `.keras` file or the checkpoint's directory.
        split: The split's name.
        metrics: {name: value}, over the whole split.
        examples: The examples in the split, each counted once.
        workers: The data-parallel replicas that evaluated it (the
            processes, without tensor parallelism).
        path: The JSON file rank 0 wrote the evaluation to.
    """
    source: pathlib.Path
    split: str
    metrics: dict
    examples: int
    workers: int
    path: pathlib.Path


def evaluate(config, split=VALIDATION, checkpoint_name=None, output=None, given=None):
    """Evaluates a run's model on a split of its recipe's data. Call it on
    every process; it calls `hvdtrain.init` itself.

    Args:
        config: The settings given: `model_dir` (the run's), and any that
            change how it is evaluated (`batch_size`, `data_dir`, threads);
            the run's recorded settings fill in the others.
        split: "validation" (what training validated on) or a split the
            recipe names in `Recipe.evaluation_splits`.
        checkpoint_name: A checkpoint of the run (its directory's name under
            `model_dir/checkpoints`, or its path) to evaluate instead of the
            exported model.
        output: The JSON file to write; default `model_dir/evaluation-SPLIT.json`
            (with `-CHECKPOINT` before `.json` for a checkpoint).
        given: The names of the settings asked for (the flags given): those
            of `CHANGEABLE` replace the run's, a `recipe` must be the run's,
            and any other is refused. None: those of them whose value in
            `config` is not TrainConfig's default.

    Returns:
        An `Evaluation`.

    Raises:
        UsageError: On every rank, with one line: a setting given that
            evaluating cannot change, no model or no such checkpoint, a
            damaged one, one of another recipe or that does not fit the
            recipe's model, an unknown split, or bad data.
    """
    given = _asked_for(config) if given is None else frozenset(given)
    model_dir = pathlib.Path(config.model_dir
                             or model_dir_lib.DEFAULT_PARENT / recipe_lib.get(config.recipe).name)
    refused = sorted(given - {*CHANGEABLE, "recipe"})
    if refused:
        raise UsageError(f"--{refused[0]} is the run's own when evaluating; hvdtrain evaluate "
                         f"may change --{', --'.join(CHANGEABLE)}")
    # The run's layout is known once its settings are read: its process sets
    # are made then.
    runtime.init(config.intra_op_threads, config.inter_op_threads, process_sets="dynamic",
                 stall_timeout=config.stall_timeout, verbose_all_ranks=config.verbose_all_ranks,
                 mpi_wait=config.mpi_wait)
    try:
        result = _evaluate(config, model_dir, split, checkpoint_name, output, given)
        runtime.leave_together()   # see trainer.train
        return result
    finally:
        runtime.stop_watching()


def _evaluate(asked, model_dir, split, checkpoint_name, output, given):
    watchdog.progress("reading the model")
    source, settings, stored, error = None, None, None, None
    path = None
    if runtime.is_main_process():
        try:
            source, settings, stored = _read(model_dir, checkpoint_name)
            # Before the evaluation, not after it: the result has a place to go.
            path = pathlib.Path(output or model_dir
                                / _output_name(split, checkpoint_name and source))
            model_dir_lib.check_writable_file(path, "--output")
        except UsageError as e:
            error = e
    collectives.raise_together(error)
    source, settings = hvd.broadcast_object((source, settings), root_rank=0,
                                            name="hvdtrain.evaluate.source")
    config = _settings(asked, given, settings, source)
    _check_workers(config, given, source)
    layout.arrange(config.tensor_parallel, config.pipeline_parallel)
    recipe = recipe_lib.get(config.recipe)
    load_split = _split_loader(recipe, split)
    # The run's precision, before any layer is made.
    keras.mixed_precision.set_global_policy(config.precision)
    keras.utils.set_random_seed(config.seed)
    watchdog.progress("building the model")
    model = compiled_model.build(recipe, config)
    # A checkpoint holds the optimizer's variables too (on every rank: each
    # takes its part of them).
    loaded = model.weights
    if checkpoint_name:
        model.optimizer.build(model.trainable_variables)
        loaded = training_state.training_variables(model)
    described = whole_state.describe(loaded)
    error, values = None, None
    if runtime.is_main_process():
        try:
            values = _load(model, described, recipe.name, source, stored)
        except UsageError as e:
            error = e
    collectives.raise_together(error)
    whole_state.scatter(loaded, values, name="hvdtrain.evaluate")
    if checkpoint_name:
        # What validation evaluated: the weights' moving average, if kept.
        model.optimizer.finalize_variable_values(model.trainable_weights)
    collectives.broadcast_variables(model.variables, root_rank=0)

    watchdog.progress("loading data")
    data = load_split(config)
    try:
        metrics = model.evaluate(watchdog.counted(data.batches()), steps=data.steps, verbose=0,
                                 return_dict=True, callbacks=[ExactEvaluation(data.steps)])
    except tf.errors.OpError as e:
        reason = input_errors.usage_error(e, data)
        if reason is None:
            raise
        raise reason from None
    metrics = {name: float(value) for name, value in metrics.items()}
    result = Evaluation(source, split, metrics, data.examples, layout.data_size(), path)
    error = None
    if runtime.is_main_process():
        try:
            atomic_files.write_whole(path, json.dumps(dict(
                source=str(source), split=split, recipe=config.recipe, examples=data.examples,
                workers=layout.data_size(), batch_size=config.batch_size, metrics=metrics),
                indent=1) + "\n")
        except OSError as e:
            # Checked at the start, and yet (a full disk): the metrics are not lost.
            error = TrainingError(f"{describe(result)}; not written to {path}: {e.strerror}")
    collectives.raise_together(error)
    return result


def describe(result):
    """An Evaluation in one line: what, on which split, the metrics."""
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.metrics.items()))
    return (f"{result.source} on split {result.split} ({result.examples} examples, "
            f"{result.workers} worker{'s' * (result.workers != 1)}): {metrics}")


def _read(model_dir, checkpoint_name):
    """(source, the run's settings or None, the checkpoint as
    checkpoint.read returns it or None), on rank 0."""
    if checkpoint_name:
        path = _checkpoint_path(model_dir, checkpoint_name)
        try:
            stored = checkpoint.read(path)
        except checkpoint.CorruptCheckpoint as e:
            raise UsageError(f"checkpoint {path} is damaged ({e}); evaluate another "
                             "--checkpoint, or the exported model") from None
        return path, stored[0].settings, stored
    path = model_dir / export.KERAS_FILE
    if not path.is_file():
        kept = checkpoint.listed(model_dir / "checkpoints")
        hint = (f"evaluate a checkpoint with --checkpoint=NAME ({_names(kept)})" if kept else
                "train one there (with --export, the default), or point --model_dir at a run")
        raise UsageError(f"no model to evaluate: {path} does not exist; {hint}")
    starts = [r for r in _log_records(model_dir) if r.get("event") == "start"]
    return path, starts[-1]["config"] if starts else None, None


def _checkpoint_path(model_dir, name):
    directory = model_dir / "checkpoints"
    path = pathlib.Path(name) if "/" in name else directory / name
    if not path.is_dir():
        raise UsageError(f"no checkpoint {name} in {directory}; "
                         f"{_names(checkpoint.listed(directory)) or 'it holds none'}")
    return path


def _names(paths):
    return f"there: {', '.join(p.name for p in paths)}" if paths else ""


def _log_records(model_dir):
    try:
        return run_log.read(model_dir)
    except (OSError, ValueError):
        return []   # no log, or not one of ours: the flags and the recipe's defaults apply


def _settings(asked, given, recorded, source):
    """The settings to evaluate with: the run's, under those `given` of the
    settings `asked`."""
    if recorded is None:
        return asked
    recipe_given = "recipe" in given
    if recipe_given and not asked.same_recipe(recorded):
        raise UsageError(f"{source} was trained with recipe {recorded['recipe']}, not "
                         f"{asked.recipe}: evaluate it with --recipe={recorded['recipe']} "
                         "(or leave --recipe out)")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    run = TrainConfig(**{k: v for k, v in recorded.items() if k in known})
    if recipe_given:
        run = run.override(recipe=asked.recipe)   # where the recipe's file is now
    elif run.recipe.endswith(".py") and not pathlib.Path(run.recipe).is_file():
        raise UsageError(f"{source} was trained with the recipe file {run.recipe}, which is "
                         "gone; give the file's path now with --recipe")
    # The directory the run is in now, wherever it trained.
    changed = {name: getattr(asked, name) for name in CHANGEABLE
               if name in given or name == "model_dir"}
    return run.override(**changed).override(jit_compile=False)


def _check_workers(config, given, source):
    """A model trained with tensor or pipeline parallelism is evaluated at
    that layout (as the run's settings say): on a multiple of T x P workers."""
    group = config.tensor_parallel * config.pipeline_parallel
    if hvd.size() % group == 0 or given & {"tensor_parallel", "pipeline_parallel"}:
        return   # (a layout given is layout.arrange's to check)
    trained = " and ".join(f"--{name}={getattr(config, name)}"
                           for name in ("tensor_parallel", "pipeline_parallel")
                           if getattr(config, name) > 1)
    raise UsageError(f"{source} was trained with {trained}, so it is evaluated on a multiple of "
                     f"{group} workers, not {hvd.size()}: start it on {group} (e.g. horovodrun "
                     f"-np {group} -H localhost:{group} hvdtrain evaluate "
                     f"--model_dir={config.model_dir})")


def _asked_for(config):
    """The settings of `config` that evaluating heeds and that are not
    TrainConfig's defaults."""
    default = TrainConfig()
    return frozenset(name for name in (*CHANGEABLE, "recipe")
                     if getattr(config, name) != getattr(default, name))


def _split_loader(recipe, split):
    """(config) -> the split's ShardedDataset, in evaluation order."""
    if split == VALIDATION:
        def validation(config):
            data = recipe.make_splits(config).validation
            if data is None:
                raise UsageError(f"recipe {recipe.name} has no validation data; "
                                 f"{_other_splits(recipe)}")
            return data
        return validation
    if split not in recipe.evaluation_splits:
        raise UsageError(f"recipe {recipe.name} has no split '{split}'; choose one of "
                         f"{', '.join([VALIDATION, *recipe.evaluation_splits])}")
    return recipe.evaluation_splits[split]


def _other_splits(recipe):
    names = list(recipe.evaluation_splits)
    return f"choose one of {', '.join(names)}" if names else "it has nothing to evaluate on"


def _load(model, described, recipe_name, source, stored):
    """The whole state to load (`whole_state`'s order, as `described`), on
    rank 0: the checkpoint `stored` (checkpoint.read's), or the weights of
    the `.keras` file `source`."""
    if stored is not None:
        found, values = stored
        checkpoint.check_fits(described, found, values)
        return values
    try:
        trained = keras.saving.load_model(source, compile=False)
    except Exception as e:   # Keras raises many kinds for a file it cannot read
        raise UsageError(f"cannot load {source} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); export it again") from None
    whole = getattr(model, "whole", model)   # a pipeline's stages, joined
    mismatch = _mismatch(whole.weights, trained.weights)
    if mismatch:
        raise UsageError(f"the model in {source} does not fit recipe {recipe_name}'s: {mismatch}; "
                         "evaluate it with the recipe and --option values that trained it")
    by_path = {mine.path: theirs.numpy() for mine, theirs in zip(whole.weights, trained.weights)}
    return [by_path[path] for path, _, _ in described]


def _mismatch(expected, found):
    if len(expected) != len(found):
        return f"it has {len(found)} weights, the recipe's model {len(expected)}"
    for mine, theirs in zip(expected, found):
        if split_variables.logical_shape(mine) != tuple(theirs.shape):
            return (f"{mine.path} has shape {tuple(theirs.shape)} there, "
                    f"{split_variables.logical_shape(mine)} here")
    return None


def _output_name(split, checkpoint_path):
    suffix = f"-{pathlib.Path(checkpoint_path).name}" if checkpoint_path else ""
    return f"evaluation-{split}{suffix}.json"
