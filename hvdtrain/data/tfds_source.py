"""Sharded pipelines from TensorFlow Datasets prepared in a data_dir.

With at least as many files as workers, each worker reads whole files
(TFDS's `ReadConfig(input_context=...)`: file i goes to worker i mod n, so a
worker's example count is known from the split's shard lengths). With fewer
files, each worker reads an even example-level subsplit instead, with a
warning.
"""

import dataclasses
import textwrap

import horovod.tensorflow as hvd
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from hvdtrain import layout, runtime
from hvdtrain.data import input_errors, sharded_dataset
from hvdtrain.data.files import count_records
from hvdtrain.datasets.builds import build_once
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives

__all__ = ["from_tfds", "prepare"]


def from_tfds(name, split, batch_size, *, training, preprocess, data_dir=None, seed=0,
              cache=False, deterministic=False, builder=None):
    """This worker's part of TFDS dataset `name`'s `split`.

    Args:
        name: The TFDS dataset's name (e.g. "cifar10").
        split: The split to read (e.g. "train", "test").
        batch_size: Examples per batch on this worker.
        training: Whether this is a training split: shuffled each epoch, in
            full batches, the same number on every worker. Otherwise every
            example once, the last batch possibly short.
        preprocess: preprocess(example, seed) -> (features, label); `seed` is
            a per-example stateless seed (shape [2]) for augmentation in
            training, None otherwise.
        data_dir: Where the dataset is prepared. Defaults to TFDS's own.
        seed: The run's seed; each epoch's order derives from (seed, epoch).
        cache: Whether to keep the decoded shard in memory after the first
            epoch (for data that fits); each epoch is then a full shuffle of it.
        deterministic: Whether tf.data's parallel stages keep their order
            (reproducible); always, where the ranks of a replica read the
            same batches (tensor or pipeline parallelism: sharded_dataset.in_order).
        builder: An existing builder (for datasets built locally, or from
            `prepare`); else by name, already prepared in `data_dir`.

    Returns:
        A `ShardedDataset`.

    Raises:
        UsageError: If the dataset is unknown or not prepared in `data_dir`,
            has no such split, or gives a training worker no full batch.
    """
    deterministic = sharded_dataset.in_order(deterministic)
    builder = builder or _builder(name, data_dir)
    if split not in builder.info.splits:
        raise UsageError(f"TFDS dataset {name} has no split '{split}'; it has "
                         f"{', '.join(sorted(builder.info.splits))}")
    info = builder.info.splits[split]
    size, rank = layout.data_size(), layout.data_rank()
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
                input_context=context, shuffle_seed=sharded_dataset.epoch_seed(seed, epoch),
                options=options))

    def explain(error):
        return _explain(builder, split, builder.info.splits[read_split].filepaths, error)

    if not training:
        return dataclasses.replace(sharded_dataset.evaluation(
            lambda epoch: sharded_dataset.preprocessed(read(False, 0), preprocess, deterministic),
            shard_examples, info.num_examples, batch_size), explain=explain)
    shuffled = sharded_dataset.shuffled_epochs(lambda: read(False, 0),
                                               lambda epoch: read(True, epoch),
                                               shard_examples, seed, cache)

    def examples(epoch):
        return sharded_dataset.preprocessed(shuffled(epoch), preprocess, deterministic, seed, epoch)

    return dataclasses.replace(
        sharded_dataset.training(examples, shard_examples, info.num_examples, batch_size, size),
        explain=explain)


def _explain(builder, split, paths, error):
    """The line for `error`, raised reading `split` (its files: `paths`) of
    the prepared `builder`."""
    rebuild = f"tfds build {builder.name} --data_dir={builder.data_dir_root} --overwrite"
    if isinstance(error, tf.errors.DataLossError):  # a file cut short or damaged
        damaged = None
        if builder.info.file_format == tfds.core.FileFormat.TFRECORD:
            _, damaged = input_errors.each_file(
                [str(p) for p in paths], lambda path: count_records(tf.data.TFRecordDataset(path)))
        where, error = (damaged[0], damaged[1]) if damaged else (f"in {builder.data_dir}", error)
        return (f"TFDS dataset {builder.name} has a damaged file {where} "
                f"({input_errors.reason(error)}); prepare it again: {rebuild}")
    return (f"reading TFDS dataset {builder.name} split {split} failed "
            f"({input_errors.reason(error)}); check the recipe's preprocessing, or if the "
            f"dataset's files are damaged: {rebuild}")


def prepare(name, data_dir=None):
    """The builder of TFDS dataset `name` in `data_dir`, downloaded and
    prepared there first if it is not: by rank 0, then by the first process
    of each other host (for a data_dir on local disks), while the others
    wait. Call it on every process.

    Returns:
        The prepared `tfds.core.DatasetBuilder`, for `from_tfds(builder=...)`.

    Raises:
        UsageError: On every rank, with the same line, if the dataset is
            unknown or cannot be downloaded (no network, say).
    """
    error = None
    for turn in (hvd.rank() == 0, hvd.local_rank() == 0 and hvd.rank() != 0):
        if turn:
            try:
                _download_and_prepare(name, data_dir)
            except UsageError as e:
                error = e
        runtime.barrier()
    collectives.raise_together(error)
    return _builder(name, data_dir)


def _download_and_prepare(name, data_dir):
    builder = _builder(name, data_dir, prepared=False)
    if builder.is_prepared():
        return
    logging.info("downloading and preparing TFDS dataset %s in %s", builder.name,
                 builder.data_dir)
    try:
        # Another job on this machine may be preparing it too: one at a time.
        build_once(lambda: _builder(name, data_dir, prepared=False))
    except Exception as e:  # TFDS raises many kinds: network, checksum, disk
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(
            f"could not download TFDS dataset {builder.name} "
            f"({textwrap.shorten(reason, 200, placeholder=' ...')}); prepare it on a "
            f"machine with network access (tfds build {builder.name} --data_dir=DIR), copy DIR "
            "here and pass --data_dir=DIR") from None


def _builder(name, data_dir, prepared=True):
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(
            f"unknown TFDS dataset '{name}'; check the name (tfds.list_builders())") from None
    if prepared and not builder.is_prepared():
        raise UsageError(f"TFDS dataset {name} is not prepared in {builder.data_dir}; prepare it "
                         "there first (tfds build --data_dir=...) or pass the right --data_dir")
    return builder
