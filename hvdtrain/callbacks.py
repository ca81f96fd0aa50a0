"""Keras 3 callbacks for data-parallel training, with Horovod's names and meaning."""

import keras
from absl import logging

import horovod.tensorflow as hvd
from hvdtrain import collectives


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copies rank `root_rank`'s model and optimizer state to every rank when
    training starts, so all ranks begin identical (random init, or a
    checkpoint restored on one rank only).

    Keras 3 builds the optimizer before `on_train_begin`, so its slots are
    broadcast before the first step rather than after it as in Keras 2.
    """

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        optimizer_variables = optimizer.variables if optimizer is not None else []
        collectives.broadcast_variables(
            list(self.model.variables) + list(optimizer_variables), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics by their average over the ranks, before
    the callbacks that come after it (progress bar, history, checkpoints)
    read them. Put it before those in the callback list."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, (int, float)))
        averaged = collectives.allreduce_scalars([logs[k] for k in names],
                                                 name=f"hvdtrain.metrics.{epoch}")
        logs.update(zip(names, averaged))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` while
    `start_epoch <= epoch < end_epoch`.

    With `staircase` the rate changes at the first batch of each epoch;
    otherwise at every batch, with a fractional epoch
    `epoch + batch / steps_per_epoch`. A constant `multiplier` implies
    staircase.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
            self.staircase = staircase
        else:
            self.multiplier = lambda epoch: multiplier
            self.staircase = True
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__}: pass steps_per_epoch "
                                 "(the dataset's length is unknown)")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set_learning_rate(self.current_epoch)
        else:
            self._set_learning_rate(self.current_epoch + batch / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)

    def _set_learning_rate(self, epoch):
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Raises the learning rate linearly from `initial_lr / size` (one
    worker's rate) to `initial_lr` (the rate scaled for `size` workers) over
    the first `warmup_epochs` epochs, batch by batch (Goyal et al., 2017)."""

    def __init__(self, initial_lr, warmup_epochs=5, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Counting the batch being started makes each epoch end on a round value.
            epoch += 1.0 / self.steps_per_epoch
            return (epoch * (hvd.size() - 1) / warmup_epochs + 1) / hvd.size()

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose and epoch == self.end_epoch - 1:
            logging.info("epoch %d: learning rate warm-up done, at %g",
                         epoch + 1, float(self.model.optimizer.learning_rate))
