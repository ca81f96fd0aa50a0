"""Stopping and resuming a run: periodic checkpoints during `fit`, and
restoring the newest intact one on every rank.

Rank 0 reads the checkpoint and broadcasts where to go on; its variables
reach the other ranks with the broadcast at the start of training, so the
checkpoint directory need not be shared between hosts. A run resumes at the
batch after the checkpoint: the input pipeline replays the epoch's order
(derived from the seed and the epoch) and skips the batches already trained.
"""

import dataclasses
import time

import horovod.tensorflow as hvd
import keras
from absl import logging

from hvdtrain import checkpoint, collectives, optimizer as optimizer_lib, runtime
from hvdtrain.checkpoint import Position
from hvdtrain.errors import TrainingError, UsageError

# Settings that shape the saved state: resuming with others cannot fit it.
STATE_SETTINGS = ("recipe", "optimizer", "precision", "backward_passes_per_step")


def training_variables(model, optimizer=None):
    """Everything a checkpoint (or an elastic commit) holds, in a fixed order:
    the model's variables (weights, statistics, random generator states),
    then its optimizer's, or `optimizer`'s (step count, learning rate, slots,
    loss scale, accumulated gradients)."""
    return [*model.variables, *(optimizer or model.optimizer).variables]


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint every `every_epochs` epochs (and after the last),
    and every `every_steps` training steps. Give it to every rank: gradients
    being accumulated are rank-local and get averaged into the checkpoint.
    Only rank 0 writes; it keeps the newest `keep` and the best by `monitor`,
    and never writes a state that is not finite (with `nan_policy` "fail"
    that ends training, with "ignore" the save is skipped)."""

    def __init__(self, directory, settings, steps, batch_size, epochs, every_epochs=1,
                 every_steps=0, keep=3, monitor=None, nan_policy="fail"):
        super().__init__()
        self.directory = directory
        self.settings = settings
        self.steps = steps
        self.batch_size = batch_size
        self.epochs = epochs
        self.every_epochs = every_epochs
        self.every_steps = every_steps
        self.keep = keep
        self.monitor = monitor
        self.nan_policy = nan_policy
        self.seconds = []   # each save's duration, on rank 0
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if (self.every_steps and step < self.steps
                and (self._epoch * self.steps + step) % self.every_steps == 0):
            self._save(self._epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if done == self.epochs or (self.every_epochs and done % self.every_epochs == 0):
            metric = (logs or {}).get(self.monitor) if self.monitor else None
            self._save(done, 0, None if metric is None else float(metric))

    def _save(self, epoch, step, metric=None):
        variables = training_variables(self.model)
        values = _with_local_state_averaged(self.model, variables)
        if not runtime.is_main_process():
            return
        start = time.perf_counter()
        values = [keras.ops.convert_to_numpy(v) for v in values]
        position = Position(epoch, step, self.steps, hvd.size(), self.batch_size)
        if not checkpoint.all_finite(values):
            # Never let a diverged state push good checkpoints out.
            message = (f"the model's state is no longer finite after {position.describe()}: "
                       "no checkpoint written; lower --learning_rate or check the data, then "
                       "resume from the last checkpoint")
            if self.nan_policy == "fail":
                raise TrainingError(message)
            logging.warning(message)
            return
        try:
            path = checkpoint.save(self.directory, values, position, self.settings, metric,
                                   names=[v.path for v in variables])
            checkpoint.retain(self.directory, self.keep,
                              checkpoint.metric_mode(self.monitor) if self.monitor else None)
        except OSError as e:
            raise TrainingError(f"could not write the checkpoint in {self.directory}: {e}; "
                                "free space there or choose another --model_dir") from None
        self.seconds.append(time.perf_counter() - start)
        logging.info("checkpoint %s written in %.2f s", path, self.seconds[-1])


def _with_local_state_averaged(model, variables):
    """`variables`' values, with each rank's gradients being accumulated
    replaced by their average over the ranks: restored on every rank, those
    give the same next update as the ranks' own would."""
    local = optimizer_lib.rank_local_variables(model.optimizer)
    if not local or hvd.size() == 1:
        return variables
    averaged = hvd.grouped_allreduce([v.value for v in local], op=hvd.Average,
                                     name="hvdtrain.checkpoint.accumulated")
    replaced = {id(v): a for v, a in zip(local, averaged)}
    return [replaced.get(id(v), v) for v in variables]


def restore(model, directory, config, steps):
    """Restores the newest intact checkpoint under `directory` into `model`
    on rank 0 and returns, on every rank, (epoch, step) where training goes
    on: (0, 0) if there is none. `steps` is this run's batches per epoch."""
    error, found = None, None
    if runtime.is_main_process():
        checkpoint.remove_unfinished(directory)
        try:
            found = _load_newest(model, directory, config)
        except UsageError as e:
            error = e
    collectives.raise_together(error)
    saved = hvd.broadcast_object(found and found.position, root_rank=0,
                                 name="hvdtrain.resume.position")
    if saved is None:
        logging.info("no checkpoint in %s: training from the start", directory)
        return 0, 0
    epoch, step = continue_at(saved, steps, hvd.size(), config.batch_size)
    going_on = Position(epoch, step, steps, hvd.size(), config.batch_size)
    if (saved.workers, saved.batch_size) != (hvd.size(), config.batch_size):
        logging.info("the checkpoint was written by %d workers x batch %d after %s; now %d x "
                     "%d: learning rate scaled for %d workers, steps recomputed, going on "
                     "after %s", saved.workers, saved.batch_size, saved.describe(), hvd.size(),
                     config.batch_size, hvd.size(), going_on.describe())
    if found:
        logging.info("resuming from %s, after %s", found.path, going_on.describe())
    return epoch, step


def continue_at(saved, steps, workers, batch_size):
    """(epoch, step) in a run of `steps` batches of `batch_size` per worker
    that goes on from `saved`: the same point of the same epoch, counted in
    examples when the number of workers or the batch size changed (the
    epoch's order then differs: its shards are cut anew)."""
    if (saved.workers, saved.batch_size, saved.steps) == (workers, batch_size, steps):
        return saved.epoch, saved.step
    examples = saved.step * saved.workers * saved.batch_size
    # Rather a few examples twice than some not at all.
    step = min(examples // (workers * batch_size), steps)
    return (saved.epoch + 1, 0) if step == steps else (saved.epoch, step)


def refuse_to_overwrite(directory):
    """Stops a fresh run from mixing its checkpoints with an earlier run's."""
    if runtime.is_main_process() and checkpoint.listed(directory):
        error = UsageError(f"{directory} holds checkpoints of an earlier run; pass --resume "
                           "to go on from them, or choose another --model_dir")
    else:
        error = None
    collectives.raise_together(error)


def _load_newest(model, directory, config):
    loaded = checkpoint.newest(directory)
    if loaded is None:
        if checkpoint.listed(directory):
            raise UsageError(f"no intact checkpoint in {directory} (all are damaged); "
                             "remove them to train from the start")
        return None
    found, values = loaded
    changed = {name: (found.settings.get(name), value)
               for name, value in dataclasses.asdict(config).items()
               if name in found.settings and found.settings[name] != value}
    for name in STATE_SETTINGS:
        if name in changed:
            raise UsageError(f"checkpoint {found.path} was written with --{name}="
                             f"{changed[name][0]}; resume with that, or use a new --model_dir")
    if changed:
        logging.info("resuming with changed settings: %s", ", ".join(
            f"{name} {old} -> {new}" for name, (old, new) in sorted(changed.items())))
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    checkpoint.assign(training_variables(model), found, values)
    return found


class ContinuedEpoch(keras.callbacks.Callback):
    """Shows `callback` the rest of an epoch begun before a restart as that
    whole epoch: batch numbers continue from `first_step`, and
    params["steps"] counts the batches already trained."""

    def __init__(self, callback, first_step):
        super().__init__()
        self.callback = callback
        self.first_step = first_step

    def set_params(self, params):
        self.callback.set_params({**params, "steps": params["steps"] + self.first_step})

    def set_model(self, model):
        self.callback.set_model(model)

    def on_train_batch_begin(self, batch, logs=None):
        self.callback.on_train_batch_begin(batch + self.first_step, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.callback.on_train_batch_end(batch + self.first_step, logs)


def _forward(hook):
    return lambda self, *args, **kwargs: getattr(self.callback, hook)(*args, **kwargs)


for _hook in ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
              "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
              "on_predict_begin", "on_predict_end", "on_predict_batch_begin",
              "on_predict_batch_end"):
    setattr(ContinuedEpoch, _hook, _forward(_hook))
