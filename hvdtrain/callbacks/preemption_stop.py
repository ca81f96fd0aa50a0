"""Stopping every rank after the same step when one is asked to (a signal
from the cluster), with a checkpoint of exactly that position."""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.callbacks.base import TrainingCallback
from hvdtrain.errors import TrainingError
from hvdtrain.faults import preemption
from hvdtrain.parallel import collectives
from hvdtrain.state.training_state import Position

__all__ = ["PreemptionStop", "StopVote"]


class PreemptionStop(TrainingCallback):
    """Ends training with `preemption.Preempted` once any rank has been asked
    to stop (`preemption.request`), on every rank after the same step, once
    rank 0 has written a checkpoint of where training stands.

    The ranks agree in two ways. During an epoch, a rank asked to stop sets
    its `vote.wanted` before its next call of the train function, and each
    step's gradient allreduce carries the vote (the trainer adds
    `vote.exchange` to the optimizer): the ranks stop after that call (of
    one step, or several with steps_per_execution), at no cost to the
    others.
    Where no step runs (before the first, during validation and the epoch's
    end) they agree with one small allreduce at the start of training and
    at each epoch's end. An epoch's last step stops at that epoch's end, so
    that the checkpoint has its validation metrics and is where the next
    start begins an epoch; the run's last epoch ends the run as usual.

    Put it after the PeriodicCheckpoint `saver`: a checkpoint that saver
    has just written of the same position is not written twice.

    Args:
        vote: The `StopVote` the train step exchanges.
        saver: The run's `PeriodicCheckpoint`, which writes the checkpoint.
        batch_size: Examples per batch on each worker, for the position.
        epochs: The run's epochs.
        start: (epoch, step) this start of training begins at.
    """

    def __init__(self, vote, saver, batch_size, epochs, start):
        super().__init__()
        self.vote, self.saver = vote, saver
        self.batch_size, self.epochs = batch_size, epochs
        self.start = self._stands_at = tuple(start)
        self._voted = False
        self._at_epoch_end = False

    def on_train_begin(self, logs=None):
        if self._agreed_between_steps():
            # At the start nothing is trained that a checkpoint lacks: the one
            # resumed from holds it, or there is nothing yet.
            self._stop(self._position(*self._stands_at), write=self._stands_at != self.start)

    def on_train_batch_begin(self, batch, logs=None):
        if not self._voted and preemption.requested():
            self.vote.wanted.assign(1.0)
            self._voted = True

    def on_train_batch_end(self, batch, logs=None):
        if not self.vote.passed():
            return
        if batch + 1 == self.params["steps"]:
            self._at_epoch_end = True   # the stop comes at the epoch's end
            return
        self._stop(self._position(self.epoch, batch + 1))

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        self._stands_at = (done, 0)
        if done == self.epochs:
            return   # the run is complete: it ends as usual
        if self._at_epoch_end or self._agreed_between_steps():
            metric = (logs or {}).get(self.saver.monitor) if self.saver.monitor else None
            self._stop(self._position(done, 0), metric=metric)

    def _agreed_between_steps(self):
        return bool(collectives.agree_on_max(int(preemption.requested() is not None),
                                             name="hvdtrain.stop_between_steps"))

    def _position(self, epoch, step):
        return Position(epoch, step, self.params["steps"], layout.data_size(), self.batch_size)

    def _stop(self, position, write=True, metric=None):
        error = None
        if write and self.saver.last_written != (position.epoch, position.step):
            try:
                self.saver.save(position.epoch, position.step,
                                None if metric is None else float(metric))
            except TrainingError as e:
                error = e
        # Every rank waits here for rank 0's checkpoint: a launcher stops the
        # others when the first process exits, and must not cut it short.
        collectives.raise_together(error)
        raise preemption.Preempted(preemption.requested(), position)


class StopVote:
    """The ranks' agreement to stop, exchanged with each update's gradients.

    `wanted` is 1 on a rank asked to stop; `exchange`, which the distributed
    optimizer runs in the traced train step with its gradient allreduce
    (same dtype and op, so Horovod fuses it into the same cycle), sets
    `agreed` to its average over the ranks. After a step every rank reads
    the same `agreed`, and a positive one means: stop after this step.

    `outcome`, when set, gives `agreed` as the train function read it at
    the end of its last call (hvdtrain.run.executions): read that way, the
    vote costs no read of a variable between steps.
    """

    def __init__(self):
        self.wanted = tf.Variable(0.0, trainable=False, name="hvdtrain_stop_wanted")
        self.agreed = tf.Variable(0.0, trainable=False, name="hvdtrain_stop_agreed")
        self.outcome = self.agreed.value

    def passed(self):
        """Whether the ranks agreed to stop, as of the last step."""
        return float(self.outcome()) > 0

    def exchange(self):
        """The vote's collective; called in the train step on every rank."""
        if hvd.size() == 1:
            self.agreed.assign(self.wanted)
            return
        self.agreed.assign(hvd.allreduce(self.wanted.value(), op=hvd.Average,
                                         name="hvdtrain.stop_vote", ignore_name_scope=True))
