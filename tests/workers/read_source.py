"""Reads a data source (SOURCE: tfrecords, images or tfds) at PATH as the
training split with batch 4 for two epochs, and as the evaluation split once;
each rank writes the example ids it read to OUT/rank<r>.json."""

import json
import sys

import tensorflow as tf

import hvdtrain
from hvdtrain import data, runtime
from hvdtrain.datasets import digits

out, source, path, *options = sys.argv[1:]
hvdtrain.init()


def parse_record(record, seed):
    example = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return example["id"], example["id"] % 2


def image_id(image, label, seed):
    return tf.cast(image[0, 0, 0], tf.int64) + 100 * label, label


def split(training):
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


train, evaluation = split(True), split(False)
epochs = [[int(i) for batch, _ in train.batches(e) for i in batch.numpy()] for e in (0, 1)]
evaluated = [int(i) for batch, _ in evaluation.batches() for i in batch.numpy()]
with open(f"{out}/rank{hvdtrain.rank()}.json", "w") as f:
    json.dump({"epochs": epochs, "evaluated": evaluated, "steps": train.steps,
               "examples": train.examples, "dropped": train.dropped,
               "eval_steps": evaluation.steps}, f)
