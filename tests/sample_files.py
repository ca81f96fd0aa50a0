"""Small data files in the formats hvdtrain's sources read, whose every
example can be told apart: TFRecord files and image folders."""

import numpy as np
import tensorflow as tf


def write_tfrecords(directory, counts):
    """Files of consecutive ids: counts[i] records in file i."""
    directory.mkdir(parents=True, exist_ok=True)
    next_id = 0
    for i, count in enumerate(counts):
        with tf.io.TFRecordWriter(str(directory / f"part-{i:03d}.tfrecord")) as writer:
            for _ in range(count):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id]))
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature={"id": feature})).SerializeToString())
                next_id += 1
    return str(directory / "part-*.tfrecord")


def write_images(root, per_class, sizes=((4, 4),)):
    """PNGs whose first pixel is their index in their class (id = index + 100 x label)."""
    for label in (0, 1):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(per_class):
            height, width = sizes[i % len(sizes)]
            image = np.full((height, width, 3), i, np.uint8)
            tf.io.write_file(str(root / f"class{label}" / f"{i}.png"), tf.io.encode_png(image))
    return str(root)
