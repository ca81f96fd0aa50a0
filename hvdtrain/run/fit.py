"""Running Keras's `fit` from where training stands, also in the middle of an
epoch.

A run resumed from a checkpoint or restarted by elastic Horovod goes on at
the batch after its position: the input pipeline replays the epoch's order
(derived from the seed and the epoch) and skips the batches already
trained. That rest of the epoch is fitted on its own, shown to the callbacks
as the whole epoch (EpochSteps); the epochs after it follow in one more
`fit`, unless a callback stopped training in the first (early stopping).

Keras's `fit` ends by writing the optimizer's moving average of the weights
(use_ema) into the model. A run here ends once, after however many fits:
these leave the weights as trained, and the caller finalizes them at the
run's end (trainer.py).
"""

import contextlib

import keras
import tensorflow as tf

from hvdtrain.faults import watchdog
from hvdtrain.run import executions

__all__ = ["EpochSteps", "from_position"]


def from_position(model, data, validation, callbacks, *, epochs, epoch, step, verbose):
    """Trains `model` on `data` (a ShardedDataset) from batch `step` of
    epoch `epoch` (both counted from 0) to the end of the run's `epochs`
    epochs; returns the history, a list of values per metric. A model of
    several steps per call (run/executions.py) has each epoch's last call
    cut at the epoch's end, and its callbacks see the steps as one step per
    call would number them."""
    # Counted: the watchdog tells a rank waiting for its input from one waiting for its peers.
    common = dict(validation_data=watchdog.counted(validation.batches()) if validation else None,
                  verbose=verbose, shuffle=False)  # the pipeline shuffles
    several = executions.of(model) is not None and model.steps_per_execution > 1

    def counted(batches):
        return watchdog.counted(_length_unknown(batches) if several else batches)

    def shown(callbacks, first_step=0):
        if not (first_step or several):
            return callbacks
        shown = [EpochSteps(c, first_step) for c in callbacks]
        if several:
            shown.append(executions.ExecutionLength(executions.of(model)))
            if verbose == 1:
                shown.append(_EpochProgressBar())
        return shown

    histories = []
    with _weights_not_finalized(model.optimizer):
        if step:
            # The rest of an epoch a checkpoint or an elastic restart cut: its
            # own fit, shown to the callbacks as the whole epoch.
            histories.append(model.fit(
                counted(_rest_of_epoch(data, epoch, step)), epochs=epoch + 1,
                initial_epoch=epoch, steps_per_epoch=data.steps - step,
                callbacks=shown(callbacks, step), **common))
            epoch = epochs if model.stop_training else epoch + 1
        if epoch < epochs:
            histories.append(model.fit(
                counted(data.for_epochs(epochs, epoch)), epochs=epochs,
                initial_epoch=epoch, steps_per_epoch=data.steps, callbacks=shown(callbacks),
                **common))
    merged = {}
    for history in histories:
        for name, values in history.history.items():
            merged.setdefault(name, []).extend(values)
    return merged


@contextlib.contextmanager
def _weights_not_finalized(optimizer):
    """Keras's fit calls `optimizer.finalize_variable_values` at its end:
    here it does nothing (see the module's docstring)."""
    optimizer.finalize_variable_values = lambda variables: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


def _length_unknown(batches):
    """`batches` with no length known to Keras: Keras counts each call of
    the train function as K steps, also an epoch's cut last one, and would
    end the run's last epoch early when that count passes a known length."""
    return batches.filter(lambda *batch: True)


def _rest_of_epoch(data, epoch, step):
    """The batches of `epoch` from batch `step` on (in deterministic mode the
    same batches as the uninterrupted run's)."""
    return data.batches(epoch).skip(step).prefetch(tf.data.AUTOTUNE)


class EpochSteps(keras.callbacks.Callback):
    """Shows `callback` the steps of an epoch as one step per call numbers
    them: in the rest of an epoch begun before a restart, batch numbers
    continue from `first_step` and params["steps"] counts the batches
    already trained; a call of several steps (run/executions.py) begins at
    its first and ends at its last, no later than the epoch's."""

    def __init__(self, callback, first_step=0):
        super().__init__()
        self.callback = callback
        self.first_step = first_step
        self._last = None

    def set_params(self, params):
        self._last = params["steps"] - 1
        self.callback.set_params({**params, "steps": params["steps"] + self.first_step})

    def set_model(self, model):
        self.callback.set_model(model)

    def on_train_batch_begin(self, batch, logs=None):
        self.callback.on_train_batch_begin(batch + self.first_step, logs)

    def on_train_batch_end(self, batch, logs=None):
        self.callback.on_train_batch_end(min(batch, self._last) + self.first_step, logs)


class _EpochProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar (verbose=1), its count ending at the epoch's
    steps when a call of several steps is cut there."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(min(batch, self.params["steps"] - 1), logs)


def _forward(hook):
    return lambda self, *args, **kwargs: getattr(self.callback, hook)(*args, **kwargs)


for _hook in ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
              "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
              "on_predict_begin", "on_predict_end", "on_predict_batch_begin",
              "on_predict_batch_end"):
    setattr(EpochSteps, _hook, _forward(_hook))
