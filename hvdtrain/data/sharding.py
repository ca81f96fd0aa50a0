"""The sharding contract shared by all sources.

Each worker reads a disjoint part of a split: whole files where there are at
least as many files as workers, else every n-th example. Sharding comes
before shuffling, so the parts are disjoint whatever the seed.

Training: every worker takes the same number of full batches per epoch, the
smallest any worker can fill, agreed with a collective, so no worker ever
waits at an epoch's end for a step the others never take. The examples past
those steps are the epoch's remainder, read by no worker that epoch; their
count is logged. Each epoch is shuffled with a seed derived from (seed,
epoch), so epoch k has the same order whether or not the run was resumed.

Evaluation: every example of the split once, the last batch possibly short;
workers may take different numbers of steps (evaluation has no collectives
until its end, see evaluation.py).
"""

import dataclasses
import math

import tensorflow as tf

from hvdtrain import collectives
from hvdtrain.errors import UsageError


@dataclasses.dataclass(frozen=True)
class ShardedDataset:
    """One worker's view of a split."""
    epoch_batches: object   # epoch (an int64 tensor) -> that epoch's batches on this worker
    steps: int              # batches per epoch on this worker
    examples: int           # examples in the whole split
    dropped: int            # training: examples no worker reads in an epoch
    training: bool

    @property
    def dataset(self):
        """Training: the batches of epoch 0, 1, 2, ... without end (give
        `model.fit` steps_per_epoch=steps); evaluation: one pass."""
        return self.from_epoch(0)

    def from_epoch(self, epoch):
        """The batches from epoch `epoch` on (to resume a run)."""
        if not self.training:
            return self.epoch_batches(tf.constant(0, tf.int64)).prefetch(tf.data.AUTOTUNE)
        epochs = tf.data.Dataset.range(epoch, 2**62)
        return epochs.flat_map(self.epoch_batches).prefetch(tf.data.AUTOTUNE)


def permutation(size, seed, epoch):
    """A random order of range(size) that depends only on (seed, epoch)."""
    key = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64), seed=key)


def training(examples, shard_examples, split_examples, batch_size, num_workers):
    """Full batches of `examples(epoch)` (this worker's shuffled examples of
    one epoch), the same number on every worker."""
    steps = collectives.agree_on_min(shard_examples // batch_size, name="hvdtrain.train_steps")
    if steps == 0:
        raise UsageError(
            f"{split_examples} training examples give no full batch of {batch_size} "
            f"on each of {num_workers} workers; lower --batch_size")

    def epoch_batches(epoch):
        return examples(epoch).batch(batch_size, drop_remainder=True).take(steps)

    return ShardedDataset(epoch_batches, steps, split_examples,
                          split_examples - steps * batch_size * num_workers, training=True)


def evaluation(examples, shard_examples, split_examples, batch_size):
    """All of this worker's examples, once, in batches."""
    if shard_examples == 0:
        raise UsageError(f"the evaluation split has {split_examples} examples, fewer than "
                         "the workers; evaluate on fewer processes")
    return ShardedDataset(lambda epoch: examples(epoch).batch(batch_size),
                          math.ceil(shard_examples / batch_size), split_examples, 0,
                          training=False)
