"""Sharded pipelines from TensorFlow Datasets prepared in a data_dir.

With at least as many files as workers, each worker reads whole files
(TFDS's `ReadConfig(input_context=...)`: file i goes to worker i mod n, so a
worker's example count is known from the split's shard lengths). With fewer
files, each worker reads an even example-level subsplit instead, with a
warning.
"""

import horovod.tensorflow as hvd
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from hvdtrain.data import sharding
from hvdtrain.errors import UsageError

def from_tfds(name, split, batch_size, *, training, preprocess, data_dir=None, seed=0,
              cache=False, deterministic=False, builder=None):
    """This worker's part of TFDS dataset `name`'s `split`.

    preprocess(example, seed) -> (features, label): `seed` is a per-example
      stateless seed (shape [2]) for augmentation in training, None otherwise.
    cache: keep the decoded shard in memory after the first epoch (for data
      that fits); each epoch is then a full shuffle of it.
    deterministic: keep tf.data's parallel stages in order (reproducible).
    builder: an existing builder (for datasets built locally); else by name.
    """
    builder = builder or _builder(name, data_dir)
    if split not in builder.info.splits:
        raise UsageError(f"TFDS dataset {name} has no split '{split}'; it has "
                         f"{', '.join(sorted(builder.info.splits))}")
    info = builder.info.splits[split]
    size, rank = hvd.size(), hvd.rank()
    if info.num_shards >= size:
        shard_examples = sum(info.shard_lengths[rank::size])
        read_split = split
        context = tf.distribute.InputContext(size, rank, 1)
    else:
        if size > 1:
            logging.warning("%s %s has %d files for %d workers: each worker reads an even "
                            "part of its examples instead of whole files",
                            name, split, info.num_shards, size)
        read_split = tfds.even_splits(split, n=size)[rank]
        shard_examples = builder.info.splits[read_split].num_examples
        context = None
    options = tf.data.Options()
    options.deterministic = deterministic

    def read(shuffle_files, epoch):
        return builder.as_dataset(
            read_split, shuffle_files=shuffle_files, read_config=tfds.ReadConfig(
                input_context=context, shuffle_seed=sharding.epoch_seed(seed, epoch),
                options=options))

    if not training:
        return sharding.evaluation(
            lambda epoch: sharding.preprocessed(read(False, 0), preprocess, deterministic),
            shard_examples, info.num_examples, batch_size)
    shuffled = sharding.shuffled_epochs(lambda: read(False, 0), lambda epoch: read(True, epoch),
                                        shard_examples, seed, cache)

    def examples(epoch):
        return sharding.preprocessed(shuffled(epoch), preprocess, deterministic, seed, epoch)

    return sharding.training(examples, shard_examples, info.num_examples, batch_size, size)


def _builder(name, data_dir):
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(f"unknown TFDS dataset '{name}'; check the name (tfds.list_builders())")
    if not builder.is_prepared():
        raise UsageError(f"TFDS dataset {name} is not prepared in {builder.data_dir}; prepare it "
                         "there first (tfds build --data_dir=...) or pass the right --data_dir")
    return builder
