"""Keras 3 callbacks for data-parallel training, with Horovod's names and meaning."""

import math
import os

import keras
from absl import logging

import horovod.tensorflow as hvd
from hvdtrain import atomic_files, collectives, runtime
from hvdtrain.errors import TrainingError, UsageError
from hvdtrain.optimizer import accumulated_only, check_loss_scale_order


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copies rank `root_rank`'s model and optimizer state to every rank when
    training starts, so all ranks begin identical (random init, or a
    checkpoint restored on one rank only).

    A model built before `fit` (one with an Input) is broadcast before the
    first step, its optimizer built for it. Keras builds a model without an
    Input only when it traces the first step: that one is broadcast after
    the first step, as Horovod does with Keras 2 (the ranks take that step
    with the same reduced gradients, then all continue from rank 0's state).
    `local_variables` (or `register_local_var`) keep their own value on each
    rank; `device` is accepted for compatibility.
    """

    def __init__(self, root_rank=0, device="", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local_variables = set()
        if local_variables is not None:
            local_variables = (local_variables if isinstance(local_variables, (list, tuple))
                               else [local_variables])
            for variable in local_variables:
                self.register_local_var(variable)

    def register_local_var(self, var):
        """Leaves `var` (a model or optimizer variable) out of the broadcast."""
        self._local_variables.add(id(var))

    def on_train_begin(self, logs=None):
        check_loss_scale_order(self.model.optimizer)
        if self.model.built:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        self._broadcast()

    def _broadcast(self):
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        optimizer_variables = optimizer.variables if optimizer is not None else []
        collectives.broadcast_variables(
            [v for v in [*self.model.variables, *optimizer_variables]
             if id(v) not in self._local_variables], self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics by their average over the ranks, before
    the callbacks that come after it (progress bar, history, checkpoints)
    read them. Put it before those in the callback list. `device` is
    accepted for compatibility."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, (int, float)))
        averaged = collectives.allreduce_scalars([logs[k] for k in names],
                                                 name=f"hvdtrain.metrics.{epoch}")
        logs.update(zip(names, averaged))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` while
    `start_epoch <= epoch < end_epoch`, as Horovod 0.28 does.

    With `staircase` the rate changes at the first batch of each epoch;
    otherwise at every batch, with a fractional epoch
    `epoch + batch / steps_per_epoch`. A constant `multiplier` means
    exponential decay: `multiplier ** (epoch - start_epoch)`.

    With `momentum_correction`, a step whose rate differs from the previous
    step's uses momentum x new / old rate (Goyal et al., 2017, section 2.1),
    for the optimizers Horovod corrects: Keras's SGD and RMSprop with
    momentum, also inside a LossScaleOptimizer; others are left alone.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required")
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._correction = None
        self._last_set = None   # (rate given, rate stored) of the last assignment

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

    def on_train_batch_end(self, batch, logs=None):
        if self._correction is not None:
            self._correction.end()
            self._correction = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)

    def _set_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = float(optimizer.learning_rate)
        lr = self.initial_lr * self.multiplier(epoch)
        if self._last_set == (lr, old_lr):
            # The rate this callback set last, still in place (a constant stretch,
            # or warm-up on one worker): assigning it again would cost ~0.2 ms a step.
            return
        optimizer.learning_rate = lr
        new_lr = float(optimizer.learning_rate)  # as stored, in float32
        self._last_set = (lr, new_lr)
        # From a rate of 0 no ratio exists (Horovod would divide by zero).
        if self.momentum_correction and old_lr != 0 and new_lr != old_lr:
            self._correction = _MomentumCorrection.begin(optimizer, new_lr / old_lr)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Raises the learning rate linearly from `initial_lr / size` (one
    worker's rate) to `initial_lr` (the rate scaled for `size` workers) over
    the first `warmup_epochs` epochs, batch by batch (Goyal et al., 2017)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # Counting the batch being started makes each epoch end on a round value.
            # A fractional warm-up ends inside an epoch: hold the full rate from there.
            epoch = min(epoch + 1.0 / self.steps_per_epoch, warmup_epochs)
            return (epoch * (hvd.size() - 1) / warmup_epochs + 1) / hvd.size()

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose and epoch == self.end_epoch - 1:
            logging.info("epoch %d: learning rate warm-up done, at %g",
                         epoch + 1, float(self.model.optimizer.learning_rate))


def decay_after_warmup(schedule, initial_lr, epochs, warmup_epochs, steps_per_epoch):
    """The rate after warm-up, from the first whole epoch after it (a
    fractional warm-up holds its final rate until then): `cosine` decays to
    0 at the last epoch; `step` multiplies by 0.1 at half and again at three
    quarters of the epochs (He et al., 2016). Set at every step, so a run
    resumed mid-epoch has its rate at once."""

    def step(epoch):
        epoch = math.floor(epoch)
        return 0.1 ** ((epoch >= epochs / 2) + (epoch >= epochs * 3 / 4))

    def cosine(epoch):
        return 0.5 * (1 + math.cos(math.pi * (epoch - warmup_epochs) / (epochs - warmup_epochs)))

    multipliers = {"step": step, "cosine": cosine}
    if schedule not in multipliers:
        raise UsageError(f"unknown learning-rate schedule '{schedule}'; "
                         f"choose one of {', '.join(multipliers)}")
    return LearningRateScheduleCallback(initial_lr, multipliers[schedule],
                                        start_epoch=warmup_epochs, staircase=False,
                                        steps_per_epoch=steps_per_epoch)


class _MomentumCorrection:
    """Runs one step as if the optimizer's momentum were `momentum * ratio`.

    Horovod changes `optimizer.momentum` for the step and restores it after;
    Keras 3 bakes `momentum` into the traced train step, so this scales the
    velocity slots instead. SGD updates `v = momentum * v - lr * g` and RMSprop
    `v = momentum * v + lr * g / rms`, then apply `v`: scaling `v` by `ratio`
    before the step is using `momentum * ratio` in it. Nesterov SGD reads
    momentum once more, `w += momentum * v - lr * g`; the missing
    `momentum * (ratio - 1) * v` is added to the weights after the step.
    """

    def __init__(self, optimizer, slots, ratio, applying):
        self.optimizer = optimizer
        self.applying = applying
        self.slots = slots
        self.ratio = ratio
        self.iterations = int(optimizer.iterations)
        for slot in slots:
            slot.assign(slot * ratio)

    @classmethod
    def begin(cls, optimizer, ratio):
        """The correction for this step, or None if `optimizer` has no momentum."""
        applying = optimizer  # the distributed one: it knows whether it only accumulated
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer = optimizer.inner_optimizer
        if not optimizer.built or not getattr(optimizer, "momentum", 0):
            return None
        if isinstance(optimizer, keras.optimizers.SGD):
            return cls(optimizer, optimizer.momentums, ratio, applying)
        if isinstance(optimizer, keras.optimizers.RMSprop):
            return cls(optimizer, optimizer._momentums, ratio, applying)  # no public name
        return None

    def end(self):
        if (int(self.optimizer.iterations) == self.iterations
                or accumulated_only(self.applying)):
            # No update this batch (gradients being accumulated, or a loss-scale
            # skip): the slots are as the step left them, so undo the scaling.
            for slot in self.slots:
                slot.assign(slot / self.ratio)
        elif getattr(self.optimizer, "nesterov", False):
            extra = self.optimizer.momentum * (self.ratio - 1)
            # The slots follow the order of the variables the optimizer was built with.
            for variable, slot in zip(self.optimizer._trainable_variables, self.slots):
                variable.assign_add(slot * extra)


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's `BestModelCheckpoint`: a ModelCheckpoint with
    `save_best_only=True` whose `filepath` may be given later (set the
    attribute before training). Only rank 0 writes, under a temporary name
    renamed into place, so a reader never sees half a file."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        # Keras checks the suffix now; a path given later is checked when saving.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only,
                         mode=mode, save_freq=save_freq)
        self.filepath = os.fspath(filepath) if filepath is not None else None

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise UsageError("BestModelCheckpoint: set its filepath before training")
        super().on_train_begin(logs)

    def _save_model(self, epoch, batch, logs):
        # Keras 3.15's own version (private API; Keras is pinned), writing atomically.
        if not runtime.is_main_process():
            return
        filepath = self._get_file_path(epoch, batch, logs)
        if self._should_save_model(epoch, batch, logs, filepath):
            atomic_files.save_model(self.model, filepath, weights_only=self.save_weights_only)


class FailOnNonFiniteLoss(keras.callbacks.Callback):
    """Ends training with a TrainingError naming the epoch, step and rank as
    soon as this rank's loss is NaN or infinite. The launcher then stops the
    other ranks (their next collective waits for this one in vain), so the
    job ends at once instead of training on a diverged model."""

    def __init__(self):
        super().__init__()
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise TrainingError(
                f"the loss is {float(loss)} at epoch {self._epoch + 1}, step {batch + 1} "
                f"on rank {hvd.rank()}; lower --learning_rate or check the data, then "
                "resume from the last checkpoint (or keep going with --nan_policy=ignore)")


class HorovodTimeline(keras.callbacks.Callback):
    """Records Horovod's timeline (negotiation, fusion and each collective,
    for every rank) over global training steps `first` to `last`
    (1-based, inclusive) into `path`, which rank 0 writes; view it in
    chrome://tracing or ui.perfetto.dev. Needs runtime.init(timeline=True)."""

    def __init__(self, path, first, last, steps_per_epoch):
        super().__init__()
        self.path = os.fspath(path)
        self.first, self.last = first, last
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0
        self._recording = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        step = self._epoch * self.steps_per_epoch + batch + 1
        if not self._recording and self.first <= step <= self.last:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            hvd.start_timeline(self.path, mark_cycles=True)
            self._recording = True

    def on_train_batch_end(self, batch, logs=None):
        if self._recording and self._epoch * self.steps_per_epoch + batch + 1 >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        if self._recording:
            self._stop()

    def _stop(self):
        hvd.stop_timeline()
        self._recording = False
        if runtime.is_main_process():
            logging.info("Horovod timeline of steps %d-%d written to %s (open it in "
                         "chrome://tracing or ui.perfetto.dev)", self.first, self.last, self.path)


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """keras.callbacks.TensorBoard without a per-step cost when it writes
    only at epoch ends (update_freq="epoch", the default): Keras 3.15 still
    builds a summary of every training metric at every step then, with no
    writer set, so nothing is written; about 0.35 ms per metric and step,
    15% of a digits_cnn step on one core."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)
