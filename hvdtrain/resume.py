"""Periodic checkpoints during `fit` (restoring them: checkpoint.py)."""

import time

import horovod.tensorflow as hvd
import keras
from absl import logging

from hvdtrain import checkpoint, optimizer as optimizer_lib, runtime
from hvdtrain.errors import TrainingError
from hvdtrain.training_state import Position, training_variables


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
