"""digits_cnn, the default recipe: a small CNN on the UCI handwritten digits
that scikit-learn ships (1,797 8x8 grey images of 10 classes): real data with
no download. Reaches about 98% validation accuracy in a few seconds of
training on two CPU workers."""

import keras
import numpy as np
from sklearn.datasets import load_digits

from hvdtrain.recipe import Recipe, Splits

VALIDATION_FRACTION = 0.2
SPLIT_SEED = 0  # fixed: the split never depends on --seed


def load_data(config):
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
    labels = digits.target.astype("int32")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    num_validation = round(len(labels) * VALIDATION_FRACTION)
    validation, train = order[:num_validation], order[num_validation:]
    return Splits(train=(images[train], labels[train]),
                  validation=(images[validation], labels[validation]))


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
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
