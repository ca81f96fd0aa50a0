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

Evaluation: every example of the split once, the last batch possibly short.
Every worker takes the same number of steps, those past the end of its part
with empty batches, which add nothing to the metrics: a model whose forward
pass exchanges data between the workers (a table sharded across them, see
hvdtrain.layers) needs every worker in each of its steps.
"""

import dataclasses
import math

import tensorflow as tf

from hvdtrain import layout
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives

__all__ = ["SHUFFLE_BUFFER", "ShardedDataset", "epoch_seed", "evaluation", "in_order",
           "preprocessed", "shuffled_epochs", "training"]


@dataclasses.dataclass(frozen=True)
class ShardedDataset:
    """One worker's view of a split, as every source returns it.

    Args:
        batches: batches(epoch) -> that epoch's batches on this worker (a
            `tf.data.Dataset`).
        steps: Batches per epoch on this worker (in training, the same on
            every worker).
        examples: Examples in the whole split.
        dropped: In training, the examples no worker reads in an epoch.
        explain: explain(error) -> a line naming the input to blame for
            `error` (a tf.errors.OpError raised fetching a batch) and the
            fix, or None; set by sources that can find it.
    """
    batches: object
    steps: int
    examples: int
    dropped: int
    explain: object = None

    def for_epochs(self, epochs, initial_epoch=0):
        """The batches of several epochs, one after the other, as one dataset.

        Args:
            epochs: The epoch to stop before.
            initial_epoch: The first epoch.

        Returns:
            A `tf.data.Dataset` of the batches of epochs initial_epoch ..
            epochs - 1: give `model.fit` this with steps_per_epoch=steps.
        """
        parts = [self.batches(epoch) for epoch in range(initial_epoch, epochs)]
        while len(parts) > 1:  # a balanced tree keeps the nesting shallow
            parts = [a.concatenate(b) for a, b in zip(parts[::2], parts[1::2])] + (
                parts[-1:] if len(parts) % 2 else [])
        return parts[0].prefetch(tf.data.AUTOTUNE)


SHUFFLE_BUFFER = 10_000


def in_order(deterministic):
    """Whether tf.data's parallel stages must keep their order: when asked,
    and wherever the ranks of a replica read its batches side by side (a
    pipeline's first stage takes the inputs, its last the targets; tensor-
    parallel ranks split each example's work): each must read the same
    examples in the same order, which parallel stages left free to reorder
    do not give."""
    return bool(deterministic) or layout.tensor_size() * layout.pipeline_size() > 1


def epoch_seed(seed, epoch):
    """The shuffle seed of `epoch` in a run seeded with `seed`."""
    return (seed * 1_000_003 + epoch) % 2**31


def shuffled_epochs(read_in_order, read_for_epoch, shard_examples, seed, cache):
    """examples(epoch): this worker's items of one epoch, shuffled by (seed, epoch).

    read_in_order(): its items in file order; read_for_epoch(epoch): the same
    in that epoch's file order. With `cache` the items are held in memory
    after the first epoch and all of them are shuffled each epoch; otherwise
    each epoch streams through a shuffle buffer.
    """
    if cache:
        stored = read_in_order().cache()
        return lambda epoch: stored.shuffle(shard_examples, seed=epoch_seed(seed, epoch))
    return lambda epoch: read_for_epoch(epoch).shuffle(SHUFFLE_BUFFER,
                                                       seed=epoch_seed(seed, epoch))


def preprocessed(ds, preprocess, deterministic, seed=None, epoch=0):
    """`ds` mapped through preprocess(item, example_seed). In training (a
    `seed` given) each example gets its own stateless seed, [epoch seed,
    index], for augmentation; in evaluation the seed is None."""
    if seed is None:
        return ds.map(lambda item: preprocess(item, None), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=deterministic)
    base = tf.constant([epoch_seed(seed, epoch), 0], tf.int64)
    return ds.enumerate().map(lambda i, item: preprocess(item, base + [0, i]),
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)


def training(examples, shard_examples, split_examples, batch_size, num_workers):
    """Full batches of `examples(epoch)` (this worker's examples of one
    epoch, shuffled with epoch_seed), the same number on every worker."""
    steps = collectives.agree_on_min(shard_examples // batch_size, name="hvdtrain.train_steps")
    if steps == 0:
        raise UsageError(
            f"{split_examples} training examples give no full batch of {batch_size} "
            f"on each of {num_workers} workers; lower --batch_size")

    def batches(epoch):
        return examples(epoch).batch(batch_size, drop_remainder=True).take(steps)

    return ShardedDataset(batches, steps, split_examples,
                          split_examples - steps * batch_size * num_workers)


def evaluation(examples, shard_examples, split_examples, batch_size):
    """All of this worker's examples, once, in batches, then empty batches
    up to the steps of the worker with the most."""
    if shard_examples == 0:
        raise UsageError(f"the evaluation split has {split_examples} examples, fewer than "
                         "the workers; evaluate on fewer processes")
    own = math.ceil(shard_examples / batch_size)
    steps = collectives.agree_on_max(own, name="hvdtrain.evaluation_steps")

    def batches(epoch=0):
        batched = examples(epoch).batch(batch_size)
        if steps > own:
            batched = batched.concatenate(batched.take(1).map(_emptied).repeat(steps - own))
        # A known length lets Keras end evaluation without running into the end of the data.
        return batched.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(
            tf.data.AUTOTUNE)

    return ShardedDataset(batches, steps, split_examples, 0)


@tf.autograph.experimental.do_not_convert
def _emptied(*batch):
    """`batch` with no examples: every tensor's first dimension cut to 0."""
    return tf.nest.map_structure(lambda t: t[:0], batch if len(batch) > 1 else batch[0])
