"""TensorBoard summaries at epochs' ends, without a cost at every step."""

import keras

__all__ = ["EpochTensorBoard"]


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """keras.callbacks.TensorBoard without a per-step cost when it writes
    only at epoch ends (update_freq="epoch", the default): Keras 3.15 still
    builds a summary of every training metric at every step then, with no
    writer set, so nothing is written (bench/np1_overhead.py measures the
    callbacks' cost per step).

    Args:
        As for `keras.callbacks.TensorBoard` (`log_dir`, `update_freq`,
        `histogram_freq`, ...); with any `update_freq` but "epoch" it
        behaves as Keras's.
    """

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)
