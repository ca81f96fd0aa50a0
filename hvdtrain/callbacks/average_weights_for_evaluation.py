"""Validation on the weights' moving average (--ema_momentum)."""

import keras
import tensorflow as tf

__all__ = ["AverageWeightsForEvaluation"]


class AverageWeightsForEvaluation(keras.callbacks.SwapEMAWeights):
    """Keras's SwapEMAWeights: the optimizer's moving averages of the weights
    (use_ema) take the weights' place for each evaluation, validation
    included, and give it back after.

    Keras swaps in place by adding and subtracting (a + b - b), which is not
    exact in floating point: each validation would move the weights a little,
    and a run with validation would differ from one without. This swap
    copies, so the weights after a validation are bit for bit those before
    it. The moving averages are the same on every rank (every rank updates
    them from the same weights), so every rank validates the same model.
    """

    def _tf_swap_variables(self, optimizer):
        for variable, average in zip(optimizer._trainable_variables,
                                     optimizer._model_variables_moving_average):
            weights = tf.identity(variable.value)
            variable.assign(average)
            average.assign(weights)
