"""Reads a data source (SOURCE: tfrecords, images or tfds) at PATH as the
training split with batch 4 for two epochs, and as the evaluation split once,
on every rank (tests/ranked/test_data_sources.py calls `read` on each):
the example ids this rank read."""

import tensorflow as tf

from hvdtrain import data, runtime
from hvdtrain.datasets import digits


def parse_record(record, seed):
    example = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return example["id"], example["id"] % 2


def image_id(image, label, seed):
    return tf.cast(image[0, 0, 0], tf.int64) + 100 * label, label


def split(source, path, options, training):
    common = dict(training=training, seed=7, deterministic="deterministic" in options)
    if source == "tfrecords":
        return data.from_tfrecords(path, parse_record, 4, **common)
    if source == "images":
        size = (6, 5) if "resize" in options else None
        return data.from_image_folder(path, 4, image_size=size, preprocess=image_id, **common)
    with runtime.main_process_first():
        builder = digits.prepare(path)
    return data.from_tfds("hvdtrain_digits", "train", 4, builder=builder,
                          preprocess=lambda ex, seed: (ex["label"], ex["label"]), **common)


def read(source, path, *options):
    """What this rank read: {"epochs": [ids of epoch 0, of epoch 1],
    "evaluated": ids, "steps", "examples", "dropped", "eval_steps"}. Call it
    on every rank."""
    train, evaluation = split(source, path, options, True), split(source, path, options, False)
    epochs = [[int(i) for batch, _ in train.batches(e) for i in batch.numpy()] for e in (0, 1)]
    evaluated = [int(i) for batch, _ in evaluation.batches() for i in batch.numpy()]
    return {"epochs": epochs, "evaluated": evaluated, "steps": train.steps,
            "examples": train.examples, "dropped": train.dropped, "eval_steps": evaluation.steps}
