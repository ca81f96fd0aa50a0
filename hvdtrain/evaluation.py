"""Exact evaluation across workers.

Each worker evaluates its own shard of a split; workers may take different
numbers of steps (shards differ by one example). Averaging the workers'
results would weigh a short shard like a long one. Instead, after a
worker's last evaluation batch, the metrics' state variables (totals and
counts, confusion counts, ...) are summed over all workers, so the results
Keras then computes from them equal a single-process evaluation of the
whole split. This holds for every metric whose state adds up, which is
every built-in Keras metric and the loss.
"""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf


class ExactEvaluation(keras.callbacks.Callback):
    """Sums evaluation metric states over workers after this worker's
    `steps` evaluation batches (its shard's length, which may differ from
    the other workers')."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps
        self._done = 0

    def on_test_begin(self, logs=None):
        self._done = 0

    def on_test_batch_end(self, batch, logs=None):
        self._done += 1
        if self._done == self.steps:
            sum_metric_states(self.model.metrics)


def sum_metric_states(metrics):
    """Replaces each metric variable by its sum over all workers."""
    if hvd.size() == 1:
        return
    variables = list({id(v): v for m in metrics for v in m.variables}.values())
    if not variables:
        return
    summed = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=hvd.Sum,
                                   name="hvdtrain.evaluation")
    for variable, value in zip(variables, summed):
        variable.assign(value)
