"""A test recipe: a linear model on an image folder at --data_dir."""

import keras

from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits


def load_data(config):
    read = dict(batch_size=config.batch_size, seed=config.seed)
    return Splits(train=data.from_image_folder(config.data_dir, training=True, **read),
                  validation=data.from_image_folder(config.data_dir, training=False, **read))


RECIPE = Recipe(name="images", load_data=load_data,
                build_model=lambda config: keras.Sequential([
                    keras.Input((None, None, 3)), keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(2)]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                defaults=dict(epochs=1, batch_size=2, warmup_epochs=0))
