"""A test recipe whose training metric `score` each rank reports from a
table, by rank and epoch, whatever the model does: rank r's labels in epoch e
are all SCORES[r][e], and `score` is the mean label. Early stopping and the
plateau schedule watching `score` must decide on its average over the ranks
(AVERAGES), which neither rank sees alone.

With patience 2, early stopping on AVERAGES stops after epoch 4; on rank 0's
own scores it would never stop, on rank 1's after epoch 3. The plateau
schedule with patience 1 lowers the rate after epochs 3 and 4 on AVERAGES;
never on rank 0's own, after epochs 2 and 3 on rank 1's."""

import dataclasses

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits

SCORES = ([10.0, 8.0, 6.0, 4.0, 2.0, 0.0], [10.0, 11.0, 15.0, 19.0, 23.0, 27.0])
AVERAGES = [sum(scores) / 2 for scores in zip(*SCORES)]   # 10, 9.5, 10.5, 11.5, 12.5, 13.5


class Score(keras.metrics.MeanMetricWrapper):
    """The mean label; smaller is better."""

    def __init__(self, name="score", **kwargs):
        super().__init__(lambda y_true, y_pred: y_true, name=name, **kwargs)
        self._direction = "down"


def _scored(batches):
    def epoch_batches(epoch):
        score = SCORES[hvd.rank() % 2][min(epoch, len(SCORES[0]) - 1)]

        def scored(x, y):
            return x, tf.fill(tf.shape(y), score)

        return batches(epoch).map(scored)
    return epoch_batches


def load_data(config):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = np.zeros((64, 1), "float32")
    train = data.from_arrays((x, y), config.batch_size, training=True, seed=config.seed)
    return Splits(train=dataclasses.replace(train, batches=_scored(train.batches)),
                  validation=data.from_arrays((x[:16], y[:16]), config.batch_size,
                                              training=False))


RECIPE = Recipe(name="rank_scores", load_data=load_data,
                build_model=lambda config: keras.Sequential([keras.Input((4,)),
                                                             keras.layers.Dense(1)]),
                loss="mse", metrics=(Score,),
                defaults=dict(epochs=6, batch_size=8, learning_rate=0.001, warmup_epochs=0,
                              best_metric="score"))
