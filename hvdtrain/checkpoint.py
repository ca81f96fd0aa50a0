"""Rank 0's checkpoints: complete or absent, never half.

Each checkpoint is a directory named after its position in training,
numbered as Keras numbers epochs (Position.shown): after step 120 of the
third epoch,

    MODEL_DIR/checkpoints/epoch-0003-step-000120/
        variables.npz     every model and optimizer variable, in order
        checkpoint.json   position, settings, workers, monitored metric,
                          variable names and shapes, the sha256 of variables.npz

written under a temporary name and renamed into place. A reader trusts a
checkpoint only if its JSON parses and the checksum matches, so one cut short
by a kill or a full disk (or damaged later) is skipped, with a warning, for
the one before it. Rank 0 keeps the newest `keep` checkpoints plus the best
by a monitored metric.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil

import keras
import numpy as np
from absl import logging

from hvdtrain.errors import UsageError

VARIABLES = "variables.npz"
META = "checkpoint.json"
FORMAT = 1
_NAME = re.compile(r"^epoch-(\d+)-step-(\d+)$")
_TEMPORARY = ".tmp-"


class CorruptCheckpoint(Exception):
    """A checkpoint with a part missing or damaged."""


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training resumes: the next batch of the next epoch, in a run of
    `workers` workers taking `steps` batches of `batch_size` per epoch."""
    epoch: int
    step: int
    steps: int
    workers: int
    batch_size: int

    @property
    def shown(self):
        """(epoch, step) as names and messages show a position, the way Keras
        counts epochs: epoch E, step S is the S-th step of the E-th epoch,
        done. The start is epoch 1, step 0; the end of the first epoch is
        epoch 1, step `steps`."""
        if self.step == 0 and self.epoch > 0:
            return self.epoch, self.steps
        return self.epoch + 1, self.step

    def describe(self):
        epoch, step = self.shown
        return f"epoch {epoch}, step {step} of {self.steps}"

    @property
    def name(self):
        epoch, step = self.shown
        return f"epoch-{epoch:04d}-step-{step:06d}"


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    path: pathlib.Path
    position: Position
    metric: float | None    # the monitored metric at this position, if measured
    settings: dict          # the TrainConfig that wrote it

    @classmethod
    def from_meta(cls, path, meta):
        return cls(path, Position(**meta["position"]), meta.get("metric"), meta["settings"])


def all_finite(values):
    """Whether every floating-point value in `values` (arrays) is finite: a
    state that is not is never written, as a checkpoint or as the model."""
    return all(np.isfinite(v).all() for v in values if np.issubdtype(v.dtype, np.floating))


def save(directory, variables, position, settings, metric=None, names=None):
    """Writes `variables` (arrays, or Keras or TF variables; `names` for
    readers) as the checkpoint at `position`; returns its path. Rank 0 only."""
    directory = pathlib.Path(directory)
    final = directory / position.name
    temporary = temporary_path(final)
    temporary.mkdir(parents=True)
    try:
        values = [np.asarray(keras.ops.convert_to_numpy(v)) for v in variables]
        with open(temporary / VARIABLES, "wb") as f:
            np.savez(f, *values)
            f.flush()
            os.fsync(f.fileno())
        meta = dict(format=FORMAT, position=dataclasses.asdict(position), metric=metric,
                    settings=settings, names=names, shapes=[list(v.shape) for v in values],
                    dtypes=[str(v.dtype) for v in values],
                    sha256=_sha256(temporary / VARIABLES))
        _write_synced(temporary / META, json.dumps(meta, indent=1))
        _fsync_directory(temporary)
        if final.exists():  # the same position saved again (e.g. a rerun of an epoch's end)
            shutil.rmtree(final)
        os.rename(temporary, final)
        _fsync_directory(directory)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return final


def listed(directory):
    """The checkpoints' directories under `directory`, newest first, unverified."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [(tuple(map(int, m.groups())), p) for p in directory.iterdir()
             if (m := _NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def read(path):
    """(Checkpoint, values) of the checkpoint at `path`; raises
    CorruptCheckpoint if any part of it is missing or damaged."""
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
    """(Checkpoint, values) of the newest intact checkpoint, or None. Damaged
    newer ones are skipped with a warning each."""
    for path in listed(directory):
        try:
            return read(path)
        except CorruptCheckpoint as e:
            logging.warning("checkpoint %s is damaged (%s); falling back to the one before it",
                            path, e)
    return None


def assign(variables, checkpoint, values):
    """Sets `variables` to a checkpoint's values, after checking that all of
    them fit: a checkpoint is loaded whole or not at all."""
    variables = list(variables)
    mismatch = None
    if len(values) != len(variables):
        mismatch = f"it holds {len(values)} variables, the model and optimizer {len(variables)}"
    else:
        for variable, value in zip(variables, values):
            if tuple(variable.shape) != value.shape:
                mismatch = (f"{variable.path} has shape {tuple(variable.shape)} there, "
                            f"{value.shape} in the checkpoint")
                break
    if mismatch:
        raise UsageError(f"checkpoint {checkpoint.path} does not fit this model: {mismatch}; "
                         "resume with the recipe and settings that wrote it, or use a new "
                         "--model_dir")
    for variable, value in zip(variables, values):
        variable.assign(value)


def remove_unfinished(directory):
    """Deletes what saves cut short left behind (temporary directories)."""
    directory = pathlib.Path(directory)
    if directory.is_dir():
        for path in directory.glob(f"{_TEMPORARY}*"):
            shutil.rmtree(path, ignore_errors=True)


def retain(directory, keep, mode=None):
    """Deletes all checkpoints but the newest `keep` and the best by their
    metric (`mode` "min" or "max"; None: no best kept)."""
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


def metric_mode(monitor):
    """"min" for losses and errors (smaller is better), else "max"."""
    return "min" if any(word in monitor for word in ("loss", "error", "mse", "mae")) else "max"


def save_model(model, path, weights_only=False):
    """Saves `model` at `path` (`.keras`, or `.weights.h5` with
    `weights_only`), atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        if weights_only:
            model.save_weights(tmp)
        else:
            model.save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def temporary_path(path):
    """Where to write `path` before renaming it into place: hidden, marked as
    unfinished, and ending with the name (Keras checks suffixes)."""
    path = pathlib.Path(path)
    return path.with_name(f"{_TEMPORARY}{os.getpid()}.{path.name}")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _write_synced(path, text):
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_directory(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
