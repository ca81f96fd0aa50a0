"""The small CNN that bench/input_pipeline.py, bench/alternatives_worker.py
and bench/step_options.py train on 32x32x3 images. It uses only layers Keras 2.15 and Keras 3 share,
since the alternatives worker also runs in the Keras 2 environment."""

import keras  # Keras 3, or tf.keras 2.15 in the Keras 2 environment


def small_cnn(classes=10, image_size=32):
    layers = keras.layers
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(classes)])
