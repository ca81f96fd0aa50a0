"""A test recipe: a linear model on TFRecords of single ids, from the glob --data_dir."""

import keras
import tensorflow as tf

from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits


def parse(record, seed):
    example = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return tf.cast(example["id"], tf.float32)[tf.newaxis], example["id"] % 2


def load_data(config):
    read = dict(parse=parse, batch_size=config.batch_size, seed=config.seed)
    return Splits(train=data.from_tfrecords(config.data_dir, training=True, **read),
                  validation=data.from_tfrecords(config.data_dir, training=False, **read))


RECIPE = Recipe(name="records", load_data=load_data,
                build_model=lambda config: keras.Sequential([keras.Input((1,)),
                                                             keras.layers.Dense(2)]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                defaults=dict(epochs=1, batch_size=4, warmup_epochs=0))
