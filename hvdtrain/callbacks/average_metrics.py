"""Training metrics averaged over the ranks at each epoch's end."""

import keras

from hvdtrain.parallel import collectives

__all__ = ["AverageMetrics"]


class AverageMetrics(keras.callbacks.Callback):
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
