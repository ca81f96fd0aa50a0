"""Running Keras's `fit` from where training stands, also in the middle of an
epoch.

A run resumed from a checkpoint or restarted by elastic Horovod goes on at
the batch after its position: the input pipeline replays the epoch's order
(derived from the seed and the epoch) and skips the batches already
trained. That rest of the epoch is fitted on its own, shown to the callbacks
as the whole epoch (ContinuedEpoch); the epochs after it follow in one more
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

__all__ = ["ContinuedEpoch", "from_position"]


def from_position(model, data, validation, callbacks, *, epochs, epoch, step, verbose):
    """Trains `model` on `data` (a ShardedDataset) from batch `step` of
    epoch `epoch` (both counted from 0) to the end of the run's `epochs`
    epochs; returns the history, a list of values per metric."""
    # Counted: the watchdog tells a rank waiting for its input from one waiting for its peers.
    common = dict(validation_data=watchdog.counted(validation.batches()) if validation else None,
                  verbose=verbose, shuffle=False)  # the pipeline shuffles
    histories = []
    with _weights_not_finalized(model.optimizer):
        if step:
            # The rest of an epoch a checkpoint or an elastic restart cut: its
            # own fit, shown to the callbacks as the whole epoch.
            histories.append(model.fit(
                watchdog.counted(_rest_of_epoch(data, epoch, step)), epochs=epoch + 1,
                initial_epoch=epoch,
                steps_per_epoch=data.steps - step,
                callbacks=[ContinuedEpoch(c, step) for c in callbacks], **common))
            epoch = epochs if model.stop_training else epoch + 1
        if epoch < epochs:
            histories.append(model.fit(
                watchdog.counted(data.for_epochs(epochs, epoch)), epochs=epochs,
                initial_epoch=epoch,
                steps_per_epoch=data.steps, callbacks=callbacks, **common))
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


def _rest_of_epoch(data, epoch, step):
    """The batches of `epoch` from batch `step` on (in deterministic mode the
    same batches as the uninterrupted run's)."""
    return data.batches(epoch).skip(step).prefetch(tf.data.AUTOTUNE)


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
