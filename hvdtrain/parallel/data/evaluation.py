"""Exact evaluation across workers.

Each worker evaluates its own shard of a split; the shards may differ by
one example (the shorter ones end with an empty batch, see
hvdtrain.data.sharding). Averaging the workers' results would weigh a short shard
like a long one. Instead, after a
worker's last evaluation batch, the metrics' state variables (totals and
counts, confusion counts, ...) are summed over the replicas (the workers,
without tensor or pipeline parallelism: the ranks of a replica hold the
same states, hvdtrain.layout), so the results
Keras then computes from them equal a single-process evaluation of the
whole split (callbacks.ExactEvaluation does it during `fit`). This holds for
every metric whose state adds up, which is every built-in Keras metric and
the loss.
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdtrain import layout

__all__ = ["sum_metric_states"]


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
