"""cifar10_resnet: image classification on CIFAR-10 (50,000 training and
10,000 test images, 32x32 RGB, 10 classes) with the CIFAR ResNet of He et
al., "Deep Residual Learning for Image Recognition" (CVPR 2016), section 4.2.

Model: a 3x3 convolution with 16 filters, then 3 stages of n basic blocks
(two 3x3 convolutions each, with batch normalization) of 16, 32 and 64
filters, the 2nd and 3rd stage starting at stride 2; global average pooling
and a 10-way dense layer. depth = 6n + 2 (--option=depth=20, 32, 44, 56, 110).
Shortcuts are identities; where a stage halves the size and doubles the
filters, the shortcut subsamples and pads the new channels with zeros (the
paper's option A, so ResNet-20 has its 0.27M parameters).

Data: TFDS `cifar10` from --data_dir (downloaded there by rank 0 when
missing), "train" for training and "test" for validation, as in the paper.
Training augmentation as in the paper: 4 pixels of zero padding on each side
(after normalization, i.e. the mean color), a random 32x32 crop and a random
horizontal flip; every image is normalized per channel with the training
set's mean and standard deviation.

Defaults follow the paper: SGD with momentum 0.9, batch 128 (per worker),
learning rate 0.1 (one worker's, scaled by the number of workers after a
5-epoch linear warm-up, Goyal et al. 2017), divided by 10 at 1/2 and 3/4 of
164 epochs. On one worker (390 steps an epoch) that is the paper's schedule:
divided at 32k and 48k iterations, ending at 64k (the paper's 182 epochs
were of its 45k-image training split). Weight decay 1e-4 (`--option=l2`, an L2 penalty of
5e-5 on the kernels: Keras adds it to the loss, whose gradient doubles it).
Batch normalization's moving averages keep 0.9 of the old value per step,
as in the Torch models of the time (Keras's default: 0.99).

    horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
        python recipes/cifar10_resnet.py --data_dir=DIR
    horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
        hvdtrain train --recipe=cifar10_resnet --data_dir=DIR --option=depth=56

The paper reports test errors of 8.75% (ResNet-20), 7.51% (32), 7.17% (44),
6.97% (56) and 6.43% (110) with batch 128; Goyal et al. report that the
scaled rate with warm-up keeps ImageNet accuracy up to a global batch of 8k.
"""

import keras
import tensorflow as tf

from hvdtrain.config import NON_NEGATIVE, POSITIVE
from hvdtrain.data.tfds_source import from_tfds, prepare
from hvdtrain.errors import UsageError
from hvdtrain.recipe import Option, Recipe, Splits

DATASET = "cifar10"
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
PADDING = 4
# Per-channel mean and standard deviation of CIFAR-10's training images (in [0, 1]).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
STAGE_FILTERS = (16, 32, 64)


def normalize(image):
    return (tf.cast(image, tf.float32) / 255.0 - MEAN) / STD


def augment(image, seed):
    """Pad, random crop and random horizontal flip, drawn from `seed`."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    padded = tf.pad(image, [[PADDING, PADDING], [PADDING, PADDING], [0, 0]])
    cropped = tf.image.stateless_random_crop(padded, IMAGE_SHAPE, seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)


def preprocess(example, seed):
    image = normalize(example["image"])
    if seed is not None:
        image = augment(image, seed)
    return image, example["label"]


def read_split(config, split, training=False):
    # The decoded training images (150 MB in all) fit in memory: cache them.
    return from_tfds(DATASET, split, config.batch_size, training=training, cache=training,
                     preprocess=preprocess, builder=prepare(DATASET, config.data_dir),
                     seed=config.seed, deterministic=config.deterministic)


def load_data(config):
    return Splits(train=read_split(config, "train", training=True),
                  validation=read_split(config, "test"))


@keras.saving.register_keras_serializable(package="cifar10_resnet")
class SubsampleAndPad(keras.layers.Layer):
    """The option-A shortcut into a stage that halves the size: every other
    pixel, with the added channels zero."""

    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels

    def call(self, inputs):
        subsampled = inputs[:, ::2, ::2, :]
        extra = self.channels - inputs.shape[-1]
        return keras.ops.pad(subsampled, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])

    def get_config(self):
        return {**super().get_config(), "channels": self.channels}


def build_model(config):
    depth = config.options["depth"]
    if depth < 8 or (depth - 2) % 6:
        raise UsageError(f"--option=depth={depth}: a CIFAR ResNet has depth 6n+2 "
                         "(8, 14, 20, 32, 44, 56, 110)")
    blocks = (depth - 2) // 6
    decay = keras.regularizers.L2(config.options["l2"] / 2)

    def conv(x, filters, strides=1):
        return keras.layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                                   kernel_initializer="he_normal", kernel_regularizer=decay)(x)

    def batch_norm(x):
        return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    inputs = keras.Input(IMAGE_SHAPE)
    x = keras.layers.ReLU()(batch_norm(conv(inputs, STAGE_FILTERS[0])))
    for stage, filters in enumerate(STAGE_FILTERS):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            shortcut = SubsampleAndPad(filters)(x) if strides == 2 else x
            y = keras.layers.ReLU()(batch_norm(conv(x, filters, strides)))
            y = batch_norm(conv(y, filters))
            x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    # Logits in float32 under mixed precision.
    outputs = keras.layers.Dense(NUM_CLASSES, kernel_regularizer=decay, dtype="float32")(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")


RECIPE = Recipe(
    name="cifar10_resnet",
    build_model=build_model,
    load_data=load_data,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=("accuracy",),
    defaults=dict(epochs=164, batch_size=128, learning_rate=0.1, optimizer="sgd", momentum=0.9,
                  warmup_epochs=5, lr_schedule="step", best_metric="val_accuracy"),
    options={
        "depth": Option(20, "layers with weights, 6n+2: 20, 32, 44, 56 or 110 as in the paper",
                        allowed=POSITIVE),
        "l2": Option(1e-4, "the paper's weight decay: an L2 penalty on the kernels, coupled with "
                             "SGD's update (--weight_decay is the decoupled kind; 0: none)",
                     allowed=NON_NEGATIVE),
    },
    unit="images",
    evaluation_splits={"train": lambda config: read_split(config, "train")},
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
