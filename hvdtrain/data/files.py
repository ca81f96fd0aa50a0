"""Sharded pipelines from files: TFRecord globs and image folders.

Each worker reads whole files when there are at least as many files as
workers (files i, i+n, ... for worker i, before any interleaving or
shuffling); with fewer files, all workers read all files and keep every n-th
item, with a warning. Items are counted before training, so every worker's
steps are known. Damaged files are looked for up front, cheaply (TFRecords:
read through and their first records parsed; images: their headers read), and
reported on every rank with one line naming the file. What only shows while
training (a record further in that does not parse, an image damaged inside)
is traced back to its file then, on the rank that read it.
"""

import dataclasses
import pathlib
import re

import horovod.tensorflow as hvd
import tensorflow as tf
from absl import logging

from hvdtrain import layout
from hvdtrain.data import image_headers, input_errors, sharded_dataset
from hvdtrain.errors import UsageError
from hvdtrain.parallel import collectives

__all__ = ["count_records", "from_image_folder", "from_tfrecords", "tfrecord_problem"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# Around each TFRecord's data: its length (8 bytes) and their checksum (4)
# before it, the data's checksum (4) after it.
_FRAMING_BYTES = 16


def from_tfrecords(pattern, parse, batch_size, *, training, seed=0, deterministic=False,
                   cache=False):
    """This worker's part of the TFRecord files matching `pattern`.

    Args:
        pattern: A glob of TFRecord files (local or any filesystem tf.io.gfile reads).
        parse: parse(serialized_record, seed) -> (features, label); `seed` is
            a per-example stateless seed (shape [2]) in training, None otherwise.
        batch_size: Examples per batch on this worker.
        training: Whether the files are for training: shuffled each epoch (the
            file order, then a shuffle buffer), in full batches, the same
            number on every worker. Otherwise every record once, the last
            batch possibly short.
        seed: The run's seed; each epoch's order derives from (seed, epoch).
        deterministic: Whether tf.data's parallel stages keep their order
            (reproducible); always, where the ranks of a replica read the
            same batches (tensor or pipeline parallelism: sharded_dataset.in_order).
        cache: Whether to keep this worker's records in memory after the
            first epoch.

    Returns:
        A `ShardedDataset` that can name the file behind a read error.

    Raises:
        UsageError: On every rank, if no file matches, a file cannot be read
            through, its first record does not parse, or a training worker
            cannot fill one batch.
    """
    deterministic = sharded_dataset.in_order(deterministic)
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise UsageError(f"no files match {pattern}; check the path and the pattern")
    mine, every_nth = _assign(files, pattern)
    # The seed parse gets, as in the pipeline (only its shape matters here).
    example_seed = tf.zeros([2], tf.int64) if training else None

    def parsed(path, first_only=False):
        records = tf.data.TFRecordDataset(path)
        return count_records(records.take(1) if first_only else records,
                             lambda record: parse(record, example_seed))

    framing, failure = input_errors.each_file(mine, _framing)
    failure = failure or _cut_inside_a_header(mine, framing)
    if not failure:
        _, failure = input_errors.each_file(mine, lambda path: parsed(path, first_only=True))
    collectives.raise_together(UsageError(tfrecord_problem(*failure)) if failure else None)

    def records(paths):
        return paths.interleave(tf.data.TFRecordDataset, cycle_length=min(len(mine), 16),
                                num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=deterministic)

    def explain(error):
        _, found = input_errors.each_file(mine, parsed)
        return found and tfrecord_problem(*found)

    records_in_files = sum(int(records) for records, _ in framing)
    dataset = _pipeline(tf.constant(mine), records_in_files, records, parse, batch_size, training,
                        seed, deterministic, cache, every_nth)
    return dataclasses.replace(dataset, explain=explain)


def _framing(path):
    """[records, bytes they take with their framing] in TFRecord file `path`."""
    lengths = tf.data.TFRecordDataset(path).map(
        lambda record: tf.cast(tf.strings.length(record), tf.int64))
    return lengths.reduce(tf.zeros([2], tf.int64),
                          lambda total, length: total + tf.stack([1, length + _FRAMING_BYTES]))


def _cut_inside_a_header(paths, framing):
    """(path, error) for the first file whose records end before the file
    does, or None. TensorFlow reads a record cut inside its 12-byte header as
    the file's end (a record cut further on raises): the bytes left over say
    it, without reading the file again."""
    for path, (_, framed) in zip(paths, framing):
        if tf.io.gfile.stat(path).length != framed:
            return path, tf.errors.DataLossError(None, None, f"truncated record at {framed}")
    return None


def tfrecord_problem(path, error):
    """The line for TFRecord file `path` whose reading or parsing raised `error`."""
    if isinstance(error, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError)):
        return (f"cannot read TFRecord file {path} ({input_errors.reason(error)}); check that "
                "it exists and is readable")
    damage = re.search(r"(truncated|corrupted) record at (\d+)", error.message)
    if isinstance(error, tf.errors.DataLossError) and damage:
        if damage.group(1) == "truncated":
            return (f"TFRecord file {path} is truncated (it ends inside the record at byte "
                    f"{damage.group(2)}); replace it with a complete copy or remove it")
        what = ("not a TFRecord file" if "Is this even a TFRecord file" in error.message
                else f"a checksum fails at byte {damage.group(2)}")
        return f"TFRecord file {path} is corrupt ({what}); replace or remove it"
    return (f"TFRecord file {path} has a record the recipe's parse function cannot read "
            f"({input_errors.reason(error)}); check that the files hold the features it parses")


def from_image_folder(root, batch_size, *, training, image_size=None, seed=0,
                      deterministic=False, cache=False, preprocess=None):
    """This worker's part of an image folder: one subfolder per class, labels
    numbered in the sorted order of the subfolder names.

    Args:
        root: The folder holding one subfolder of images per class (.jpg,
            .jpeg, .png, .bmp or .gif; decoded to 3 channels).
        batch_size: Examples per batch on this worker.
        training: Whether the images are for training: shuffled each epoch, in
            full batches, the same number on every worker. Otherwise every
            image once, the last batch possibly short.
        image_size: (height, width) to resize every image to; None keeps them
            as they are, and then they must all have one size.
        seed: The run's seed; each epoch's order derives from (seed, epoch).
        deterministic: Whether tf.data's parallel stages keep their order
            (reproducible); always, where the ranks of a replica read the
            same batches (tensor or pipeline parallelism: sharded_dataset.in_order).
        cache: Whether to keep this worker's decoded images in memory after
            the first epoch.
        preprocess: preprocess(image, label, seed) -> (features, label),
            after decoding; `seed` as for `from_tfrecords`. The default passes
            the uint8 image and the label through.

    Returns:
        A `ShardedDataset` that can name the image behind a decoding error.

    Raises:
        UsageError: On every rank, if there are no images in class
            subfolders, an image's header is unreadable or not a whole
            image's, sizes differ without `image_size`, or a training worker
            cannot fill one batch.
    """
    deterministic = sharded_dataset.in_order(deterministic)
    root = pathlib.Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    files = [(str(f), label) for label, name in enumerate(classes)
             for f in sorted((root / name).iterdir()) if f.suffix.lower() in IMAGE_EXTENSIONS]
    if not files:
        raise UsageError(f"no images in class subfolders of {root}; expected "
                         f"{root}/<class>/<image>.jpg or .png")
    mine, every_nth = _assign(files, str(root))
    paths, labels = zip(*mine)
    collectives.raise_together(_check_headers(paths, files[0][0], image_size is None))

    def decoded(entries):
        def load(path, label):
            image = _decode(path)
            if image_size is not None:
                image = tf.cast(tf.image.resize(image, image_size), tf.uint8)
            return {"image": image, "label": label}
        return entries.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)

    def parse(item, seed):
        if preprocess:
            return preprocess(item["image"], item["label"], seed)
        return item["image"], item["label"]

    def explain(error):
        _, found = input_errors.each_file(paths, lambda path: tf.shape(_decode(path)))
        return found and _corrupt_image(found[0], input_errors.reason(found[1]))

    dataset = _pipeline((tf.constant(paths), tf.constant(labels, tf.int64)), len(mine),
                        decoded, parse, batch_size, training, seed, deterministic, cache,
                        every_nth)
    return dataclasses.replace(dataset, explain=explain)


def _check_headers(paths, first, one_size):
    """The UsageError for the first of `paths` whose header is not a whole
    image's or, with `one_size`, gives another size than `first`'s; None if none."""
    expected = None
    for path in ([first] if one_size else []) + list(paths):
        try:
            height, width = image_headers.size(path)
        except image_headers.BadImage as e:
            return UsageError(_corrupt_image(path, str(e)))
        except OSError as e:
            return UsageError(f"cannot read image {path} ({e.strerror}); check that it exists "
                              "and is readable")
        if expected is None:
            expected = (height, width)
        elif one_size and (height, width) != expected:
            return UsageError(
                f"images of different sizes: {path} is {height}x{width} (height x width), the "
                f"first, {first}, is {expected[0]}x{expected[1]}; resize the files to one size, "
                "or have the recipe resize them with "
                "from_image_folder(..., image_size=(HEIGHT, WIDTH))")
    return None


def _corrupt_image(path, reason):
    return f"corrupt image {path} ({reason}); replace or remove it"


def _assign(files, source):
    """This worker's files, and whether it keeps only every n-th item of them."""
    size, rank = layout.data_size(), layout.data_rank()
    if len(files) >= size:
        return files[rank::size], False
    logging.warning("%s has %d files for %d workers: each worker reads every %d-th item "
                    "of all of them instead of whole files", source, len(files), size, size)
    return files, True


def count_records(records, parse=None):
    """The number of `records` (a dataset), each parsed first with `parse`."""
    if parse is not None:
        records = records.map(parse)
    return records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)


def _decode(path):
    return tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)


def _pipeline(entries, count, items, parse, batch_size, training, seed, deterministic, cache,
              every_nth):
    """entries: this worker's files (a nest of tensors); count: the items in
    them; items(dataset of entries) -> dataset of items."""
    size, rank = layout.data_size(), layout.data_rank()
    if every_nth:
        shard_examples, split_examples = len(range(rank, count, size)), count
    else:
        shard_examples = count
        # Each replica once: its ranks read the same files.
        split_examples = int(collectives.allreduce_scalars([count], op=hvd.Sum,
                                                           name="hvdtrain.examples")[0]
                             ) // layout.tensor_size()
    num_entries = len(tf.nest.flatten(entries)[0])

    def read(order):
        ds = items(tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda t: tf.gather(t, order), entries)))
        return ds.shard(size, rank) if every_nth else ds

    in_order = tf.range(num_entries)
    if not training:
        return sharded_dataset.evaluation(
            lambda epoch: sharded_dataset.preprocessed(read(in_order), parse, deterministic),
            shard_examples, split_examples, batch_size)

    def read_for_epoch(epoch):  # a new file order every epoch
        # Stateless: tf.random.shuffle's kernel keeps its state between eager
        # calls, so a second dataset built in one process got another order.
        return read(tf.random.experimental.stateless_shuffle(
            in_order, seed=[sharded_dataset.epoch_seed(seed, epoch), 0]))

    shuffled = sharded_dataset.shuffled_epochs(lambda: read(in_order), read_for_epoch,
                                               shard_examples, seed, cache)

    def examples(epoch):
        return sharded_dataset.preprocessed(shuffled(epoch), parse, deterministic, seed, epoch)

    return sharded_dataset.training(examples, shard_examples, split_examples, batch_size, size)
