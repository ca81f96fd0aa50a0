"""Rank 0's checkpoints: their format, saving them, and restoring a run
from them.

Each checkpoint is a directory named after its position in training,
numbered as Keras numbers epochs (Position.shown): after step 120 of the
third epoch,

    MODEL_DIR/checkpoints/epoch-0003-step-000120/
        variables.npz     every model and optimizer variable, in order
        checkpoint.json   position, settings, workers, monitored metric, the
                          state of callbacks that keep one (early stopping,
                          plateau), variable names and shapes, the sha256
                          of variables.npz

written under a temporary name and renamed into place. A reader trusts a
checkpoint only if its JSON parses and the checksum matches, so one cut short
by a kill or a full disk (or damaged later) is skipped, with a warning, for
the one before it. Rank 0 keeps the newest `keep` checkpoints plus the best
by a monitored metric.

Resuming, rank 0 reads the newest intact checkpoint and broadcasts where to
go on and its variables, so the checkpoint directory need not be shared
between hosts. The
run goes on at the batch after the checkpoint (see run/fit.py).

The state is saved whole as rank 0 gathers it (hvdtrain.state.whole_state):
a table sharded across the workers in row order, a tensor-parallel weight
whole, and with pipeline parallelism every stage's variables, stage after
stage; each worker takes its part back when a run resumes. The checkpoint is
one atomic directory like any other, and resumes on any number of workers
and tensor-parallel ranks (with the pipeline's stages as they were).
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil

import horovod.tensorflow as hvd
import keras
import numpy as np
from absl import logging

from hvdtrain import layout, runtime
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives
from hvdtrain.state import atomic_files, whole_state
from hvdtrain.state.training_state import Position, continue_at, training_variables

__all__ = ["FORMAT", "META", "STATE_SETTINGS", "VARIABLES", "Checkpoint", "CorruptCheckpoint",
           "all_finite", "check_fits", "listed", "newest", "read", "refuse_to_overwrite", "restore",
           "retain", "save"]

VARIABLES = "variables.npz"
META = "checkpoint.json"
FORMAT = 1
_NAME = re.compile(r"^epoch-(\d+)-step-(\d+)$")

# Settings that shape the saved state: resuming with others cannot fit it.
STATE_SETTINGS = ("recipe", "optimizer", "precision", "backward_passes_per_step",
                  "pipeline_parallel", "pipeline_cuts")


class CorruptCheckpoint(Exception):
    """A checkpoint with a part missing or damaged."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's metadata, as `read` finds it (its values apart)."""
    path: pathlib.Path
    position: Position
    metric: float | None    # the monitored metric at this position, if measured
    settings: dict          # the TrainConfig that wrote it
    # {state_key: state} of callbacks.base.KeptState callbacks
    callbacks: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_meta(cls, path, meta):
        return cls(path, Position(**meta["position"]), meta.get("metric"), meta["settings"],
                   meta.get("callbacks", {}))


def all_finite(values):
    """Whether every floating-point value in `values` is finite: a state that
    is not is never written, as a checkpoint or as the model.

    Args:
        values: NumPy arrays; those of other dtypes (integer counters) are
            not looked at.

    Returns:
        True if no floating-point array holds a NaN or an infinity.
    """
    return all(np.isfinite(v).all() for v in values if np.issubdtype(v.dtype, np.floating))


def save(directory, variables, position, settings, metric=None, names=None, callbacks=None):
    """Writes the checkpoint at `position`, atomically. Rank 0 only.

    The same position saved again replaces the earlier checkpoint.

    Args:
        directory: The checkpoints' directory (created if missing).
        variables: Arrays, or Keras or TF variables, in the order `assign`
            sets them back.
        position: The `training_state.Position` after which they were taken;
            it names the checkpoint's directory.
        settings: The run's settings (a dict of the TrainConfig), for the
            checks on resuming.
        metric: The monitored metric at this position, for `retain`'s best.
        names: The variables' names, for readers.
        callbacks: {state_key: state} of the callbacks that keep a state
            (callbacks.base.KeptState), restored with the variables.

    Returns:
        The checkpoint's path.

    Raises:
        OSError: If it cannot be written (full disk, no permission); the
            part written under the temporary name is removed.
    """
    directory = pathlib.Path(directory)
    final = directory / position.name
    temporary = atomic_files.temporary_path(final)
    temporary.mkdir(parents=True)
    try:
        values = [np.asarray(keras.ops.convert_to_numpy(v)) for v in variables]
        with open(temporary / VARIABLES, "wb") as f:
            np.savez(f, *values)
            f.flush()
            os.fsync(f.fileno())
        meta = dict(format=FORMAT, position=dataclasses.asdict(position), metric=metric,
                    settings=settings, callbacks=callbacks or {}, names=names,
                    shapes=[list(v.shape) for v in values],
                    dtypes=[str(v.dtype) for v in values],
                    sha256=_sha256(temporary / VARIABLES))
        atomic_files.write_synced(temporary / META, json.dumps(meta, indent=1))
        atomic_files.fsync_directory(temporary)
        if final.exists():  # the same position saved again (e.g. a rerun of an epoch's end)
            shutil.rmtree(final)
        os.rename(temporary, final)
        atomic_files.fsync_directory(directory)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return final


def listed(directory):
    """The checkpoints' directories under `directory`, newest first, unverified.

    Returns:
        A list of paths, empty if `directory` does not exist.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [(tuple(map(int, m.groups())), p) for p in directory.iterdir()
             if (m := _NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def read(path):
    """Reads and verifies the checkpoint at `path`.

    Returns:
        (Checkpoint, values): its metadata and its variables' values, a list
        of NumPy arrays in the order they were saved.

    Raises:
        CorruptCheckpoint: If any part of it is missing, damaged (the
            checksum does not match) or of an unknown format.
    """
    path = pathlib.Path(path)
    try:
        meta = json.loads((path / META).read_text())
        if meta.get("format") != FORMAT:
            raise CorruptCheckpoint(f"unknown format {meta.get('format')!r}")
        if _sha256(path / VARIABLES) != meta["sha256"]:
            raise CorruptCheckpoint(f"{VARIABLES} does not match its checksum")
        with np.load(path / VARIABLES) as stored:
            values = [stored[f"arr_{i}"] for i in range(len(meta["shapes"]))]
        return Checkpoint.from_meta(path, meta), values
    except CorruptCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{type(e).__name__}: {e}") from None


def newest(directory):
    """The newest intact checkpoint under `directory`. Damaged newer ones are
    skipped with a warning each.

    Returns:
        (Checkpoint, values) as `read` returns them, or None if no checkpoint
        is intact.
    """
    for path in listed(directory):
        try:
            return read(path)
        except CorruptCheckpoint as e:
            logging.warning("checkpoint %s is damaged (%s); falling back to the one before it",
                            path, e)
    return None


def check_fits(described, checkpoint, values):
    """Checks that a checkpoint's values fit the state they would be loaded
    into, all of them: a checkpoint is loaded whole or not at all.

    Args:
        described: The state's variables as `whole_state.describe` gives
            them: (path, whole shape, dtype) in the order they were saved.
        checkpoint: The `Checkpoint` the values come from, named in errors.
        values: Its values, as `read` returns them.

    Raises:
        UsageError: If the number of variables or a shape differs: the
            checkpoint was written by another model or settings.
    """
    mismatch = None
    if len(values) != len(described):
        mismatch = f"it holds {len(values)} variables, the model and optimizer {len(described)}"
    else:
        for (path, shape, _), value in zip(described, values):
            if tuple(shape) != value.shape:
                mismatch = f"{path} has shape {tuple(shape)} there, {value.shape} in the checkpoint"
                break
    if mismatch:
        raise UsageError(f"checkpoint {checkpoint.path} does not fit this model: {mismatch}; "
                         "resume with the recipe and settings that wrote it, or use a new "
                         "--model_dir")


def retain(directory, keep, mode=None):
    """Deletes all checkpoints but the newest `keep` and the best by their
    metric.

    Args:
        directory: The checkpoints' directory.
        keep: How many of the newest to keep.
        mode: "min" or "max": the direction in which the metric is best;
            None keeps no best. Checkpoints without a finite metric are
            never the best.
    """
    paths = listed(directory)
    kept = set(paths[:keep])
    if mode is not None:
        scored = []
        for path in paths:
            try:
                metric = json.loads((path / META).read_text()).get("metric")
            except (OSError, ValueError):
                continue
            if metric is not None and np.isfinite(metric):
                scored.append((metric if mode == "min" else -metric, path))
        if scored:
            kept.add(min(scored)[1])
    for path in paths:
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)


def restore(model, directory, config, steps):
    """Restores the newest intact checkpoint under `directory` into `model`
    and tells every rank where training goes on. Call it on every rank:
    rank 0 reads it, and each stage's leader (rank 0 without a pipeline)
    takes its variables, the ranks of a stage their parts of split ones,
    and the other replicas theirs by a broadcast from replica 0.

    Args:
        model: The compiled Keras model (its optimizer is built if needed).
        directory: The checkpoints' directory.
        config: This run's `TrainConfig`, compared with the checkpoint's.
        steps: This run's batches per epoch, to map the checkpoint's
            position onto this run's workers and batch size.

    Returns:
        (epoch, step, workers, callback_states) on every rank: where training
        goes on, the workers that wrote the checkpoint, and the {state_key:
        state} of the callbacks that keep a state (callbacks.base.KeptState);
        (0, 0, None, {}) if there is no checkpoint.

    Raises:
        UsageError: On every rank, if all checkpoints are damaged, the newest
            intact one was written with another recipe, optimizer, precision,
            backward_passes_per_step, pipeline or use of EMA, or its
            variables do not fit the model.
    """
    # On every rank: the state restored includes the optimizer's variables,
    # and each rank takes its part of it.
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = training_variables(model)
    described = whole_state.describe(variables)
    error, found, values = None, None, None
    if runtime.is_main_process():
        atomic_files.remove_unfinished(directory)
        try:
            found, values = _load_newest(described, directory, config)
        except UsageError as e:
            error = e
    collectives.raise_together(error)
    saved, states = hvd.broadcast_object(found and (found.position, found.callbacks),
                                         root_rank=0, name="hvdtrain.resume.position") or (
                                             None, {})
    if saved is None:
        logging.info("no checkpoint in %s: training from the start", directory)
        return 0, 0, None, {}
    whole_state.scatter(variables, values, name="hvdtrain.restore")
    # Every rank holds the state from here, whether or not anything is left
    # to train (the end's statistics and export read them all).
    collectives.broadcast_variables(variables, root_rank=0)
    # Counted in data-parallel replicas: the workers, without tensor parallelism.
    replicas = layout.data_size()
    epoch, step = continue_at(saved, steps, replicas, config.batch_size)
    going_on = Position(epoch, step, steps, replicas, config.batch_size)
    if (saved.workers, saved.batch_size) != (replicas, config.batch_size):
        logging.info("the checkpoint was written by %d workers x batch %d after %s; now %d x "
                     "%d: learning rate scaled for %d workers, steps recomputed, going on "
                     "after %s", saved.workers, saved.batch_size, saved.describe(), replicas,
                     config.batch_size, replicas, going_on.describe())
    if found:
        logging.info("resuming from %s, after %s", found.path, going_on.describe())
    return epoch, step, saved.workers, states


def refuse_to_overwrite(directory):
    """Stops a fresh run from mixing its checkpoints with an earlier run's.
    Call it on every rank.

    Raises:
        UsageError: On every rank, if `directory` holds checkpoints.
    """
    if runtime.is_main_process() and listed(directory):
        error = UsageError(f"{directory} holds checkpoints of an earlier run; pass --resume "
                           "to go on from them, or choose another --model_dir")
    else:
        error = None
    collectives.raise_together(error)


def _load_newest(described, directory, config):
    loaded = newest(directory)
    if loaded is None:
        if listed(directory):
            raise UsageError(f"no intact checkpoint in {directory} (all are damaged); "
                             "remove them to train from the start")
        return None, None
    found, values = loaded
    changed = {name: (found.settings.get(name), value)
               for name, value in dataclasses.asdict(config).items()
               if name in found.settings and found.settings[name] != value}
    for name in STATE_SETTINGS:
        # A recipe file that moved is the same recipe (TrainConfig.same_recipe).
        if name in changed and not (name == "recipe" and config.same_recipe(found.settings)):
            raise UsageError(f"checkpoint {found.path} was written with --{name}="
                             f"{changed[name][0]}; resume with that, or use a new --model_dir")
    averaged = found.settings.get("ema_momentum")
    if (averaged is None) != (config.ema_momentum is None):
        # The moving averages are optimizer variables: with or without them,
        # the state has another shape.
        written = f"with --ema_momentum={averaged}" if averaged is not None else (
            "without --ema_momentum")
        raise UsageError(f"checkpoint {found.path} was written {written}; resume the same way, "
                         "or use a new --model_dir")
    if changed:
        logging.info("resuming with changed settings: %s", ", ".join(
            f"{name} {old} -> {new}" for name, (old, new) in sorted(changed.items())))
    check_fits(described, found, values)
    return found, values


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
