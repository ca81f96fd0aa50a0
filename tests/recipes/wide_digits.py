"""A test recipe: the digits data with a wide MLP (4.3M parameters), whose
checkpoints (weights and momentum, 35 MB) take long enough to write that a
test can kill a process in the middle of one."""

import keras
from hvdtrain.recipes import digits_cnn

from hvdtrain.recipe import Recipe

RECIPE = Recipe(name="wide_digits", load_data=digits_cnn.load_data,
                build_model=lambda config: keras.Sequential([
                    keras.Input((8, 8, 1)), keras.layers.Flatten(),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(2048, activation="relu"),
                    keras.layers.Dense(10)]),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=("accuracy",),
                defaults=dict(epochs=2, batch_size=32, learning_rate=0.01, warmup_epochs=0))
