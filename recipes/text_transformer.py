"""text_transformer: sentiment classification of IMDB movie reviews (Maas et
al., 2011: 25,000 training and 25,000 test reviews, positive or negative)
with a Transformer encoder (Vaswani et al., "Attention Is All You Need",
NeurIPS 2017).

Model: token embeddings scaled by sqrt(d_model) plus the paper's sinusoidal
position encodings, then N encoder blocks as in the paper (multi-head
self-attention and a ReLU feed-forward layer, each with dropout, a residual
connection and layer normalization after it); padding is masked in the
attention and in the mean over positions that feeds the 2-way dense head.
Options: d_model, layers, heads, mlp_dim, dropout.

Data: TFDS `imdb_reviews` (config plain_text) from --data_dir (downloaded
there by rank 0 when missing), "train" for training and "test" for
validation. Tokens need no fitted vocabulary, so every worker agrees without
communication: lowercase, `<br />` and punctuation removed, split on
whitespace, each word hashed into vocab_size - 2 buckets (ids from 2 up: 0
pads, 1 starts every sequence), cut or padded to sequence_length.

The token embedding's gradient is sparse (tf.IndexedSlices, the rows of the
batch's words): workers allgather it, or with --sparse_as_dense reduce it as
a dense tensor, which is cheaper once the gathered rows outgrow the table.
Either way the update is the same, and dense: Keras 3's Adam turns the
gradient into a dense one when it updates its moments, so every row's
moments decay at every step, as with a dense gradient; the sparse form only
saves communication.

Defaults: Adam, batch 32 per worker, learning rate 1e-4 (one worker's,
scaled by the number of workers) after a 1-epoch linear warm-up, cosine
decay to 0 over 10 epochs.

    horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
        python recipes/text_transformer.py --data_dir=DIR
    horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
        hvdtrain train --recipe=text_transformer --data_dir=DIR --sparse_as_dense

The dataset's paper reports 88.89% test accuracy for its best model (word
vectors learned on the reviews, with bag-of-words features).
"""

import math

import keras
import numpy as np
import tensorflow as tf

from hvdtrain.config import POSITIVE, Range
from hvdtrain.data.tfds_source import from_tfds, prepare
from hvdtrain.errors import UsageError
from hvdtrain.recipe import Option, Recipe, Splits

DATASET = "imdb_reviews"
PAD, START = 0, 1
RESERVED_IDS = 2


def tokenize(text, vocab_size, sequence_length):
    """Token ids (int32, [sequence_length]) of one review."""
    text = tf.strings.lower(text, encoding="utf-8")
    text = tf.strings.regex_replace(text, r"<br\s*/?>", " ")
    text = tf.strings.regex_replace(text, r"['’]", "")  # don't -> dont
    text = tf.strings.regex_replace(text, r"[\pP\pS]", " ")
    words = tf.strings.split(text)[:sequence_length - 1]
    ids = tf.strings.to_hash_bucket_fast(words, vocab_size - RESERVED_IDS) + RESERVED_IDS
    ids = tf.concat([[START], tf.cast(ids, tf.int32)], axis=0)
    ids = tf.pad(ids, [[0, sequence_length - tf.shape(ids)[0]]], constant_values=PAD)
    return tf.ensure_shape(ids, [sequence_length])


def read_split(config, split, training=False):
    vocab_size, length = config.options["vocab_size"], config.options["sequence_length"]
    if vocab_size <= RESERVED_IDS or length < 2:
        raise UsageError(f"--option=vocab_size={vocab_size} must be above {RESERVED_IDS} and "
                         f"--option=sequence_length={length} at least 2")

    def preprocess(example, seed):
        return tokenize(example["text"], vocab_size, length), example["label"]

    return from_tfds(DATASET, split, config.batch_size, training=training, cache=training,
                     preprocess=preprocess, builder=prepare(DATASET, config.data_dir),
                     seed=config.seed, deterministic=config.deterministic)


def load_data(config):
    return Splits(train=read_split(config, "train", training=True),
                  validation=read_split(config, "test"))


def position_encoding(length, depth):
    """The paper's sinusoids: [length, depth]."""
    positions = np.arange(length)[:, np.newaxis]
    rates = np.exp(-math.log(10000.0) * (np.arange(depth) // 2 * 2) / depth)
    angles = positions * rates
    return np.where(np.arange(depth) % 2 == 0, np.sin(angles), np.cos(angles)).astype("float32")


@keras.saving.register_keras_serializable(package="text_transformer")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embeddings x sqrt(depth) plus sinusoidal position encodings, for
    sequences of up to `max_length` tokens; masks the padding (id 0)."""

    def __init__(self, vocab_size, max_length, depth, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.max_length, self.depth = vocab_size, max_length, depth
        self.tokens = keras.layers.Embedding(vocab_size, depth, name="tokens")
        self.positions = position_encoding(max_length, depth)

    def build(self, input_shape):
        self.tokens.build(input_shape)

    def call(self, ids):
        embedded = self.tokens(ids) * math.sqrt(self.depth)
        length = keras.ops.shape(ids)[1]
        return embedded + keras.ops.cast(self.positions[np.newaxis], embedded.dtype)[:, :length]

    def compute_mask(self, ids, mask=None):
        return keras.ops.not_equal(ids, PAD)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size,
                "max_length": self.max_length, "depth": self.depth}


def encoder_block(x, options, index):
    """Post-norm as in the paper: x = LayerNorm(x + Dropout(Sublayer(x)))."""
    depth, heads, dropout = options["d_model"], options["heads"], options["dropout"]
    layers = keras.layers
    # Keras masks the padding: as keys here (from the embedding's mask), in the mean pooling.
    attended = layers.MultiHeadAttention(heads, depth // heads, dropout=dropout,
                                         name=f"block{index}_attention")(x, x)
    x = layers.LayerNormalization(epsilon=1e-6, name=f"block{index}_norm1")(
        layers.Add()([x, layers.Dropout(dropout)(attended)]))
    hidden = layers.Dense(options["mlp_dim"], activation="relu", name=f"block{index}_mlp1")(x)
    transformed = layers.Dense(depth, name=f"block{index}_mlp2")(hidden)
    return layers.LayerNormalization(epsilon=1e-6, name=f"block{index}_norm2")(
        layers.Add()([x, layers.Dropout(dropout)(transformed)]))


def build_model(config):
    options = config.options
    if options["d_model"] % options["heads"]:
        raise UsageError(f"--option=d_model={options['d_model']} must be a multiple of "
                         f"--option=heads={options['heads']}")
    # Any length up to sequence_length (the pipeline pads to it).
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = TokenAndPositionEmbedding(options["vocab_size"], options["sequence_length"],
                                  options["d_model"], name="embedding")(tokens)
    x = keras.layers.Dropout(options["dropout"])(x)
    for index in range(options["layers"]):
        x = encoder_block(x, options, index)
    x = keras.layers.GlobalAveragePooling1D()(x)
    logits = keras.layers.Dense(2, dtype="float32", name="logits")(x)
    return keras.Model(tokens, logits, name="text_transformer")


RECIPE = Recipe(
    name="text_transformer",
    build_model=build_model,
    load_data=load_data,
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=("accuracy",),
    defaults=dict(epochs=10, batch_size=32, learning_rate=1e-4, optimizer="adam",
                  warmup_epochs=1, lr_schedule="cosine", best_metric="val_accuracy"),
    options={
        "vocab_size": Option(2**15, "token ids, 2 reserved (padding, start): words hash "
                                    "into the rest", allowed=Range(3)),
        "sequence_length": Option(256, "tokens per review (longer ones are cut)", allowed=POSITIVE),
        "d_model": Option(128, "width of the embeddings and of every block", allowed=POSITIVE),
        "layers": Option(2, "encoder blocks", allowed=POSITIVE),
        "heads": Option(4, "attention heads (d_model must be a multiple)", allowed=POSITIVE),
        "mlp_dim": Option(512, "width of each block's feed-forward layer", allowed=POSITIVE),
        "dropout": Option(0.1, "dropout rate", allowed=Range(0, 1)),
    },
    unit="sequences",
    evaluation_splits={"train": lambda config: read_split(config, "train")},
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
