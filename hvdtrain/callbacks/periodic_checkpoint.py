"""Checkpoints during `fit`: when to save, and what (the format and the
writing: hvdtrain.state.checkpoint)."""

import time

import horovod.tensorflow as hvd
import keras
from absl import logging

from hvdtrain import layout, runtime
from hvdtrain.callbacks.base import CallSteps, TrainingCallback, kept_states, monitor_mode
from hvdtrain.errors import TrainingError
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib
from hvdtrain.parallel.data_parallel.statistics import average_statistics
from hvdtrain.state import checkpoint, whole_state
from hvdtrain.state.training_state import Position, training_variables

__all__ = ["PeriodicCheckpoint"]


class PeriodicCheckpoint(CallSteps, TrainingCallback):
    """Saves a checkpoint every `every_epochs` epochs (and after the last,
    also when early stopping ends the run), and every `every_steps` training
    steps. Give it to every rank: gradients being accumulated are rank-local
    and get averaged into the checkpoint, and the state held in parts
    (tables sharded across the workers, tensor-parallel weights, pipeline
    stages) is gathered whole.
    Only rank 0 writes; it keeps the newest `keep` and the best by `monitor`,
    and never writes a state that is not finite (with `nan_policy` "fail"
    that ends training, with "ignore" the save is skipped).

    Args:
        directory: Where the checkpoints go (MODEL_DIR/checkpoints).
        settings: The run's settings (a dict), recorded in each checkpoint.
        batch_size: The batch per worker.
        epochs: The run's epochs: the last one always ends with a checkpoint.
        every_epochs: Epochs between checkpoints (0: only after the last).
        every_steps: Training steps between checkpoints inside epochs (0:
            none); with several steps per call of the train function, at
            the end of the call that reaches each multiple.
        keep: How many of the newest checkpoints are kept.
        monitor: The metric whose best checkpoint is kept too (None: none).
            Better is the direction the metric declares, as in Keras's
            callbacks; a name no metric of the model has is judged by its
            words (losses and errors are smaller when better).
        nan_policy: "fail" or "ignore", as --nan_policy.
        kept: Callbacks whose state (base.KeptState) each checkpoint keeps;
            put this callback after them.
    """

    def __init__(self, directory, settings, batch_size, epochs, every_epochs=1,
                 every_steps=0, keep=3, monitor=None, nan_policy="fail", kept=()):
        super().__init__()
        self.directory, self.settings = directory, settings   # what is written where
        self.batch_size, self.epochs = batch_size, epochs
        self.every_epochs, self.every_steps = every_epochs, every_steps   # when
        self.keep, self.monitor = keep, monitor   # which are kept
        self.nan_policy = nan_policy
        self.kept = kept
        self.seconds = []   # each save's duration, on rank 0
        self.last_written = None   # (epoch, step) of this run's newest save

    def on_train_batch_end(self, batch, logs=None):
        # With several steps per call: at the first call's end at or after
        # each multiple of every_steps.
        step = batch + 1
        if (self.every_steps and step < self.params["steps"]
                and self.global_step(batch) // self.every_steps
                > (self.global_step(self.call_first) - 1) // self.every_steps):
            self.save(self.epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        if (done == self.epochs or self.model.stop_training
                or (self.every_epochs and done % self.every_epochs == 0)):
            metric = (logs or {}).get(self.monitor) if self.monitor else None
            self.save(done, 0, None if metric is None else float(metric))

    def save(self, epoch, step, metric=None):
        """Writes a checkpoint of training after `step` of `epoch` (on rank 0;
        call it on every rank), with the monitored `metric`'s value if known.

        Raises:
            TrainingError: On rank 0, if the checkpoint cannot be written, or
                the state is not finite under nan_policy "fail".
        """
        # The replicas' own statistics, made one: what is saved is every rank's.
        average_statistics(self.model)
        variables = training_variables(self.model)
        described = whole_state.describe(variables)
        values = whole_state.gather(variables, _with_local_state_averaged(self.model, variables),
                                    name="hvdtrain.checkpoint")
        self.last_written = (epoch, step)   # on every rank: they decide the same
        if not runtime.is_main_process():
            return
        start = time.perf_counter()
        values = [keras.ops.convert_to_numpy(v) for v in values]
        position = Position(epoch, step, self.params["steps"], layout.data_size(), self.batch_size)
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
                                   names=[path for path, _, _ in described],
                                   callbacks=kept_states(self.kept))
            checkpoint.retain(self.directory, self.keep,
                              monitor_mode(self.model, self.monitor) if self.monitor else None)
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
    if not local or layout.data_size() == 1:
        return variables
    # Over the replicas: a replica's ranks hold the same (or their parts' own).
    averaged = hvd.grouped_allreduce([v.value for v in local], op=hvd.Average,
                                     name="hvdtrain.checkpoint.accumulated",
                                     process_set=layout.data_set())
    replaced = {id(v): a for v, a in zip(local, averaged)}
    return [replaced.get(id(v), v) for v in variables]
