"""digits_cnn, the default recipe: a small CNN on the UCI handwritten digits
that scikit-learn ships (1,797 8x8 grey images of 10 classes), read as the
local TFDS dataset `hvdtrain_digits`: real data with no download. `make demo`
(two CPU workers) reaches at least 95% validation accuracy, as
tests/parallel/test_demo.py checks."""

import keras
import tensorflow as tf

from hvdtrain import runtime
from hvdtrain.data.tfds_source import from_tfds
from hvdtrain.datasets import digits
from hvdtrain.recipe import Recipe, Splits


def preprocess(example, seed):
    return tf.cast(example["image"], tf.float32) / 255.0, example["label"]


def read_split(config, split, training=False):
    with runtime.main_process_first():
        builder = digits.prepare(config.data_dir)
    return from_tfds("hvdtrain_digits", split, config.batch_size, training=training,
                     cache=training, preprocess=preprocess, builder=builder, seed=config.seed,
                     deterministic=config.deterministic)


def load_data(config):
    return Splits(train=read_split(config, "train", training=True),
                  validation=read_split(config, "validation"))


def build_model(config):
    layers = keras.layers
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dropout(0.25),
        layers.Dense(128, activation="relu"),
        layers.Dense(10, dtype="float32"),  # logits in float32 under mixed precision
    ], name="digits_cnn")


RECIPE = Recipe(
    name="digits_cnn",
    build_model=build_model,
    load_data=load_data,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=("accuracy",),
    defaults=dict(epochs=15, batch_size=32, learning_rate=0.02, optimizer="sgd",
                  momentum=0.9, warmup_epochs=2),
    evaluation_splits={"train": lambda config: read_split(config, "train")},
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
