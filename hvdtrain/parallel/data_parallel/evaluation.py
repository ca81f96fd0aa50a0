"""Exact evaluation across workers.

Each worker evaluates its own shard of a split; the shards may differ by
one example (the shorter ones end with an empty batch, see
hvdtrain.data.sharded_dataset). Averaging the workers' results would weigh a short shard
like a long one. Instead, after a
worker's last evaluation batch, the metrics' state variables (totals and
counts, confusion counts, ...) are summed over the replicas (the workers,
without tensor or pipeline parallelism: the ranks of a replica hold the
same states, hvdtrain.layout), so the results
Keras then computes from them equal a single-process evaluation of the
whole split (callbacks.ExactEvaluation does it during `fit`). This holds for
every metric whose state adds up, which is every built-in Keras metric and
the loss.

A worker's empty batches run through the model as one row of zeros whose
outputs are dropped (hvdtrain.parallel.empty_batches): `EmptyBatchesStep`.
"""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel import empty_batches

__all__ = ["EmptyBatchesStep", "sum_metric_states"]


class EmptyBatchesStep:
    """Keras 3's test step (keras/src/backend/tensorflow/trainer.py) with
    its forward pass run by empty_batches.forward. Installed as a model's
    `test_step` where the model has Keras's own (`install`)."""

    def __init__(self, model):
        self.model = model

    @classmethod
    def install(cls, model):
        if type(model).test_step is keras.Model.test_step:
            model.test_step = cls(model)

    def __call__(self, data):
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = empty_batches.forward(
            lambda x: model(x, training=False) if model._call_has_training_arg else model(x), x)
        loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                   training=False)
        model._loss_tracker.update_state(loss, sample_weight=empty_batches.rows(x))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def sum_metric_states(metrics):
    """Replaces each metric variable by its sum over the data-parallel replicas.

    Args:
        metrics: Keras metrics (`model.metrics`); a variable shared by
            several is summed once.
    """
    if layout.data_size() == 1:
        return
    variables = list({id(v): v for m in metrics for v in m.variables}.values())
    if not variables:
        return
    summed = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=hvd.Sum,
                                   name="hvdtrain.evaluation", process_set=layout.data_set())
    for variable, value in zip(variables, summed):
        variable.assign(value)
