"""A test recipe: TFDS mnist from --data_dir (never prepared in the tests)."""

import keras

from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits


def load_data(config):
    read = dict(preprocess=lambda ex, seed: (ex["image"], ex["label"]),
                batch_size=config.batch_size, data_dir=config.data_dir)
    return Splits(train=data.from_tfds("mnist", "train", training=True, **read),
                  validation=data.from_tfds("mnist", "test", training=False, **read))


RECIPE = Recipe(name="tfds_mnist", load_data=load_data,
                build_model=lambda config: keras.Sequential([keras.Input((28, 28, 1)),
                                                             keras.layers.Flatten(),
                                                             keras.layers.Dense(10)]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
