"""The sharding contract shared by all sources.

Worker r of n reads examples r, r+n, r+2n, ... of a split (sharding comes
before shuffling, so shards are disjoint whatever the seed). Shards differ in
length by at most one example, so the number of full batches may differ by
one across workers; training takes the smallest, agreed with a collective,
so no worker ever waits at an epoch's end for a step the others never take.
The examples past those steps, fewer than n x (batch_size + 1), are the
epoch's remainder: read by no worker that epoch (shuffling changes which).
"""

import dataclasses

import tensorflow as tf

from hvdtrain import collectives
from hvdtrain.errors import UsageError


@dataclasses.dataclass(frozen=True)
class ShardedDataset:
    """One worker's view of a split."""
    dataset: tf.data.Dataset   # batches; for training exactly `steps` an epoch
    steps: int                 # batches per epoch on this worker
    examples: int              # examples in the whole split
    dropped: int               # training: examples no worker reads in an epoch


def agreed_train_steps(shard_examples, batch_size, split_examples, num_workers):
    """Full batches per epoch that every worker can take (collective)."""
    steps = collectives.agree_on_min(shard_examples // batch_size,
                                     name="hvdtrain.train_steps")
    if steps == 0:
        raise UsageError(
            f"{split_examples} training examples give no full batch of {batch_size} "
            f"on each of {num_workers} workers; lower --batch_size")
    return steps
