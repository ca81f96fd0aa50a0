"""Validation metrics exact over the whole split, however it is sharded."""

import keras

from hvdtrain.parallel.data_parallel.evaluation import sum_metric_states
from hvdtrain.parallel.data_parallel.statistics import average_statistics

__all__ = ["ExactEvaluation"]


class ExactEvaluation(keras.callbacks.Callback):
    """Sums evaluation metric states over workers after this worker's
    `steps` evaluation batches (its shard's length, which may differ from
    the other workers'); see hvdtrain.parallel.data_parallel.evaluation. Before
    evaluating, the replicas' own statistics (batch normalization's) become
    their average, so that every shard is evaluated with the same model
    (hvdtrain.parallel.data_parallel.statistics). Give it to every rank: both are
    collectives.

    Args:
        steps: This worker's evaluation batches (the `steps` of its
            evaluation `ShardedDataset`); after the last of them the states
            are summed.
    """

    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self._summed = False

    def on_test_begin(self, logs=None):
        self._summed = False
        average_statistics(self.model)

    def on_test_batch_end(self, batch, logs=None):
        # `batch`: the last step of the call (of several, with
        # steps_per_execution; Keras may count past the data's end).
        if not self._summed and batch + 1 >= self.steps:
            sum_metric_states(self.model.metrics)
            self._summed = True
