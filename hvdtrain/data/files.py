"""Sharded pipelines from files: TFRecord globs and image folders.

Each worker reads whole files when there are at least as many files as
workers (files i, i+n, ... for worker i, before any interleaving or
shuffling); with fewer files, all workers read all files and keep every n-th
item, with a warning. Items are counted before training, so every worker's
steps are known, and a corrupt file is reported up front on every rank.
"""

import pathlib

import horovod.tensorflow as hvd
import tensorflow as tf
from absl import logging

from hvdtrain import collectives
from hvdtrain.data import sharding
from hvdtrain.errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def from_tfrecords(pattern, parse, batch_size, *, training, seed=0, deterministic=False,
                   cache=False):
    """This worker's part of the TFRecord files matching `pattern`.

    parse(serialized_record, seed) -> (features, label); `seed` is a
    per-example stateless seed (shape [2]) in training, None otherwise.
    cache: keep this worker's records in memory after the first epoch.
    """
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise UsageError(f"no files match {pattern}; check the path and the pattern")
    mine, every_nth = _assign(files, pattern)
    counts, error = [], None
    try:
        counts = [_count_records(f) for f in mine]
    except UsageError as e:
        error = e
    collectives.raise_together(error)

    def records(paths):
        return paths.interleave(tf.data.TFRecordDataset, cycle_length=min(len(mine), 16),
                                num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=deterministic)

    return _pipeline(tf.constant(mine), sum(counts), records, parse, batch_size, training,
                     seed, deterministic, cache, every_nth)


def from_image_folder(root, batch_size, *, training, image_size=None, seed=0,
                      deterministic=False, cache=False, preprocess=None):
    """This worker's part of an image folder: one subfolder per class, labels
    numbered in the sorted order of the subfolder names.

    image_size: (height, width) to resize every image to; None keeps them as
      they are, and then they must all have one size.
    preprocess(image, label, seed) -> (features, label), after decoding; the
      default passes the uint8 image and the label through.
    cache: keep this worker's decoded images in memory after the first epoch.
    """
    root = pathlib.Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = [(str(f), label) for label, name in enumerate(classes)
             for f in sorted((root / name).iterdir()) if f.suffix.lower() in IMAGE_EXTENSIONS]
    if not files:
        raise UsageError(f"no images in class subfolders of {root}; expected "
                         f"{root}/<class>/<image>.jpg or .png")
    mine, every_nth = _assign(files, str(root))
    paths, labels = zip(*mine)
    first_size = tf.shape(_decode(files[0][0]))[:2]

    def decoded(entries):
        def load(path, label):
            image = _decode(path)
            if image_size is not None:
                image = tf.cast(tf.image.resize(image, image_size), tf.uint8)
                return {"image": image, "label": label}
            tf.debugging.assert_equal(
                tf.shape(image)[:2], first_size, message=(
                    "hvdtrain: images of different sizes (the first is "
                    f"{files[0][0]}); pass --image_size=HEIGHT,WIDTH to resize them"))
            return {"image": image, "label": label}
        return entries.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    def parse(item, seed):
        if preprocess:
            return preprocess(item["image"], item["label"], seed)
        return item["image"], item["label"]

    return _pipeline((tf.constant(paths), tf.constant(labels, tf.int64)), len(mine), decoded,
                     parse, batch_size, training, seed, deterministic, cache, every_nth)


def _assign(files, source):
    """This worker's files, and whether it keeps only every n-th item of them."""
    size, rank = hvd.size(), hvd.rank()
    if len(files) >= size:
        return files[rank::size], False
    logging.warning("%s has %d files for %d workers: each worker reads every %d-th item "
                    "of all of them instead of whole files", source, len(files), size, size)
    return files, True


def _count_records(path):
    try:
        return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64),
                                                        lambda n, _: n + 1))
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise UsageError(f"corrupt TFRecord file {path} ({e.message.splitlines()[0]}); "
                         "replace or remove it")


def _decode(path):
    return tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)


def _pipeline(entries, count, items, parse, batch_size, training, seed, deterministic, cache,
              every_nth):
    """entries: this worker's files (a nest of tensors); count: the items in
    them; items(dataset of entries) -> dataset of items."""
    size, rank = hvd.size(), hvd.rank()
    if every_nth:
        shard_examples, split_examples = len(range(rank, count, size)), count
    else:
        shard_examples = count
        split_examples = int(collectives.allreduce_scalars([count], op=hvd.Sum,
                                                           name="hvdtrain.examples")[0])
    num_entries = len(tf.nest.flatten(entries)[0])

    def read(order):
        ds = items(tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda t: tf.gather(t, order), entries)))
        return ds.shard(size, rank) if every_nth else ds

    in_order = tf.range(num_entries)
    if not training:
        return sharding.evaluation(
            lambda epoch: sharding.preprocessed(read(in_order), parse, deterministic),
            shard_examples, split_examples, batch_size)

    def read_for_epoch(epoch):  # a new file order every epoch
        return read(tf.random.shuffle(in_order, seed=sharding.epoch_seed(seed, epoch)))

    shuffled = sharding.shuffled_epochs(lambda: read(in_order), read_for_epoch, shard_examples,
                                        seed, cache)

    def examples(epoch):
        return sharding.preprocessed(shuffled(epoch), parse, deterministic, seed, epoch)

    return sharding.training(examples, shard_examples, split_examples, batch_size, size)
