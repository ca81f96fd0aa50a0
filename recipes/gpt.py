"""gpt: a decoder-only transformer language model (Radford et al., "Language
Models are Unsupervised Multitask Learners", 2019: GPT-2's pre-norm blocks),
tensor-parallel with --tensor_parallel=T (Megatron-LM's layout: Shoeybi et
al., 2019), cut into --pipeline_parallel=P stages (the tied embedding held
by the first and last) and data-parallel over the workers / (T x P)
replicas.

Model: a vocabulary-parallel token embedding plus learned positions, N
blocks of pre-norm causal self-attention (heads split over the replica's
ranks) and a GELU MLP (column- then row-parallel), a final layer norm, and
the vocabulary-parallel head: the embedding in reverse (tied, the default)
or a matrix of its own. The loss is the cross-entropy on the logits split by
vocabulary, never gathered. Options: vocab_size, sequence_length, d_model,
layers, heads, mlp_dim, dropout, tie_embeddings.

Data (--option=dataset):
- `synthetic` (the default, no download): a random second-order Markov
  language of vocab_size tokens: each token followed by one of `successors`
  tokens, each with a probability that depends on the token before it too. Its numbers are known:
  the unigram baseline (the cross-entropy of predicting tokens by their
  frequency) and the achievable loss (of the language's own probabilities),
  both logged at the start and measured on the validation split.
- `tiny_shakespeare`: TFDS's text/tiny_shakespeare from --data_dir (rank 0
  downloads it when missing), as bytes (vocab_size 256).

Throughput is logged in tokens per second, with the model FLOPs (6 x
parameters x tokens, the standard estimate) and their utilisation of the
device's peak where it is known.

    horovodrun --config-file horovodrun.cfg -np 2 -H localhost:2 \\
        hvdtrain train --recipe=gpt --tensor_parallel=2
    horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
        hvdtrain train --recipe=gpt --tensor_parallel=2 --pipeline_parallel=2
"""

import dataclasses
import functools

import keras
import numpy as np
from absl import logging

from hvdtrain.config import POSITIVE, Range
from hvdtrain.data import from_arrays
from hvdtrain.errors import UsageError
from hvdtrain.layers import (
    ColumnParallelDense,
    ParallelMultiHeadAttention,
    RowParallelDense,
    VocabParallelEmbedding,
    VocabParallelSparseCategoricalCrossentropy,
)
from hvdtrain.recipe import Option, Recipe, Splits

SYNTHETIC, SHAKESPEARE = "synthetic", "tiny_shakespeare"
BYTES = 256


@dataclasses.dataclass(frozen=True)
class Language:
    """A random second-order Markov language: token b is followed by one of
    successors[b] (a few tokens), token c = successors[b, i] after the pair
    (a, b) with probability probabilities[a, b, i]. The previous token tells
    which tokens may come; the one before it, how likely each is: a model
    learns the first from one token back, the second only by attending two."""
    successors: np.ndarray
    probabilities: np.ndarray

    @classmethod
    def random(cls, vocab, successors, seed):
        rng = np.random.default_rng(seed)
        return cls(np.stack([rng.choice(vocab, successors, replace=False) for _ in range(vocab)]),
                   rng.dirichlet(np.ones(successors), size=(vocab, vocab)))

    def sample(self, sequences, length, seed):
        """[sequences, length] tokens, each sequence from a random first pair."""
        rng = np.random.default_rng(seed)
        vocab, options = self.successors.shape
        tokens = np.empty((sequences, length), np.int32)
        tokens[:, 0] = rng.integers(0, vocab, size=sequences)
        tokens[:, 1] = self.successors[tokens[:, 0], rng.integers(0, options, size=sequences)]
        cumulative = np.cumsum(self.probabilities, axis=-1)
        for t in range(2, length):
            a, b = tokens[:, t - 2], tokens[:, t - 1]
            choice = (rng.random(sequences)[:, None] > cumulative[a, b]).sum(-1)
            tokens[:, t] = self.successors[b, np.minimum(choice, options - 1)]
        return tokens

    def cross_entropy(self, tokens):
        """Mean -log p of tokens[:, 2:] under the language itself: the
        loss no model can beat on them, in nats."""
        a, b, c = tokens[:, :-2], tokens[:, 1:-1], tokens[:, 2:]
        matches = self.successors[b] == c[..., None]
        return float(-np.log((self.probabilities[a, b] * matches).sum(-1)).mean())


def unigram_cross_entropy(train, validation, vocab):
    """The loss of predicting each validation token by its frequency in training."""
    counts = np.bincount(train.ravel(), minlength=vocab) + 1.0   # add-one: no token impossible
    return float(-np.log(counts / counts.sum())[validation.ravel()].mean())


@functools.lru_cache(maxsize=4)
def synthetic_corpus(vocab, successors, length, train_sequences, validation_sequences, seed):
    """(train, validation) token arrays of `length` + 1 tokens per sequence,
    and the Language they come from; the same on every worker."""
    language = Language.random(vocab, successors, seed)
    return (language.sample(train_sequences, length + 1, seed + 1),
            language.sample(validation_sequences, length + 1, seed + 2), language)


def shakespeare_corpus(config):
    """(train, validation) byte arrays of TFDS tiny_shakespeare, cut into
    sequences of sequence_length + 1."""
    import tensorflow_datasets as tfds

    from hvdtrain.data.tfds_source import prepare

    builder = prepare(SHAKESPEARE, config.data_dir)   # rank 0 downloads it, once
    length = config.options["sequence_length"] + 1
    splits = []
    for split in ("train", "validation"):
        text = b"".join(example["text"] for example in tfds.as_numpy(builder.as_dataset(split)))
        tokens = np.frombuffer(text, np.uint8).astype(np.int32)
        splits.append(tokens[:len(tokens) // length * length].reshape(-1, length))
    return splits


def load_data(config):
    options = config.options
    if options["dataset"] == SYNTHETIC:
        train, validation, language = synthetic_corpus(
            options["vocab_size"], options["successors"], options["sequence_length"],
            options["train_sequences"], options["validation_sequences"], options["language_seed"])
        logging.info("synthetic language of %d tokens: validation loss of the unigram baseline "
                     "%.3f, achievable %.3f (nats)", options["vocab_size"],
                     unigram_cross_entropy(train, validation, options["vocab_size"]),
                     language.cross_entropy(validation))
    else:
        train, validation = shakespeare_corpus(config)

    def split(tokens, training):
        return from_arrays((tokens[:, :-1], tokens[:, 1:]), config.batch_size, training=training,
                           seed=config.seed)

    return Splits(train=split(train, True), validation=split(validation, False))


def block(x, options, index):
    """GPT-2's pre-norm block: x + Attention(LN(x)), then x + MLP(LN(x))."""
    layers, dropout = keras.layers, options["dropout"]
    heads = options["heads"]
    h = layers.LayerNormalization(epsilon=1e-5, name=f"block{index}_norm1")(x)
    h = ParallelMultiHeadAttention(heads, options["d_model"] // heads, dropout=dropout,
                                   name=f"block{index}_attention")(h, h, use_causal_mask=True)
    x = layers.Add(name=f"block{index}_residual1")([x, layers.Dropout(dropout)(h)])
    h = layers.LayerNormalization(epsilon=1e-5, name=f"block{index}_norm2")(x)
    h = ColumnParallelDense(options["mlp_dim"], activation="gelu", name=f"block{index}_mlp_up")(h)
    h = RowParallelDense(options["d_model"], name=f"block{index}_mlp_down")(h)
    return layers.Add(name=f"block{index}_residual2")([x, layers.Dropout(dropout)(h)])


def build_model(config):
    options = config.options
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    small = keras.initializers.RandomNormal(stddev=0.02)   # GPT-2's
    embedding = VocabParallelEmbedding(options["vocab_size"], options["d_model"],
                                       tie_weights=options["tie_embeddings"],
                                       embeddings_initializer=small, name="token_embedding")
    positions = keras.ops.cumsum(keras.ops.ones_like(tokens), axis=1) - 1
    x = embedding(tokens) + keras.layers.Embedding(
        options["sequence_length"], options["d_model"], embeddings_initializer=small,
        name="position_embedding")(positions)
    x = keras.layers.Dropout(options["dropout"])(x)
    for index in range(options["layers"]):
        x = block(x, options, index)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    # This rank's range of the vocabulary's logits, for the loss to take as they are.
    return keras.Model(tokens, embedding(x, reverse=True), name="gpt")


def check(config):
    options = config.options
    if options["d_model"] % options["heads"]:
        raise UsageError(f"--option=d_model={options['d_model']} must be a multiple of "
                         f"--option=heads={options['heads']}")
    if options["dataset"] == SHAKESPEARE and options["vocab_size"] != BYTES:
        raise UsageError(f"--option=dataset={SHAKESPEARE} reads bytes: set "
                         f"--option=vocab_size={BYTES}")
    if options["successors"] > options["vocab_size"]:
        raise UsageError(f"--option=successors={options['successors']} must be at most "
                         f"--option=vocab_size={options['vocab_size']}")
    parts = config.tensor_parallel
    for name in ("vocab_size", "heads", "mlp_dim"):
        if options[name] % parts:
            raise UsageError(f"--option={name}={options[name]} does not split over "
                             f"--tensor_parallel={parts} ranks; make it a multiple of {parts}")


RECIPE = Recipe(
    name="gpt",
    build_model=build_model,
    load_data=load_data,
    loss=VocabParallelSparseCategoricalCrossentropy(),
    defaults=dict(epochs=3, batch_size=32, learning_rate=1e-3, optimizer="adamw",
                  warmup_epochs=1, lr_schedule="cosine"),
    options={
        "dataset": Option(SYNTHETIC, "synthetic (no download) or tiny_shakespeare (TFDS, "
                                     "from --data_dir)", choices=(SYNTHETIC, SHAKESPEARE)),
        "vocab_size": Option(128, "tokens (a multiple of --tensor_parallel)", allowed=Range(2)),
        "sequence_length": Option(64, "tokens per sequence", allowed=Range(3)),
        "d_model": Option(64, "width of the embeddings and of every block", allowed=POSITIVE),
        "layers": Option(2, "transformer blocks", allowed=POSITIVE),
        "heads": Option(4, "attention heads (d_model must be a multiple)", allowed=POSITIVE),
        "mlp_dim": Option(256, "width of each block's MLP", allowed=POSITIVE),
        "dropout": Option(0.0, "dropout rate", allowed=Range(0, 1)),
        "tie_embeddings": Option(True, "the head is the token embedding in reverse"),
        "successors": Option(4, "synthetic: tokens that may follow each token", allowed=POSITIVE),
        "train_sequences": Option(2048, "synthetic: training sequences", allowed=POSITIVE),
        "validation_sequences": Option(256, "synthetic: validation sequences",
                                       allowed=POSITIVE),
        "language_seed": Option(0, "synthetic: the seed of the language and its samples",
                                allowed=Range(0, 2**31)),
    },
    unit="sequences",
    check=check,
    tokens_per_example=lambda config: config.options["sequence_length"],
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
