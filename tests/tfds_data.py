"""Writes a real TFDS dataset directory for a registered TFDS dataset (e.g.
cifar10, imdb_reviews) from examples a test makes, so the recipes' TFDS path
(`tfds.builder(name, data_dir=...)`, `is_prepared()`, `as_dataset`) runs on
small local data with no download.

The files are what `tfds build` would write: TFRecord shards of examples
serialized with the registered builder's own features, named
`{name}-{split}.tfrecord-0000i-of-0000n` in the builder's data_dir
(root/name[/config]/version), with TFDS's metadata beside them.
"""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds


def write(name, data_dir, splits, files_per_split=4):
    """Writes `splits` ({split: [example dict, ...]}) as TFDS dataset `name`
    in `data_dir`, each split in `files_per_split` files; returns the builder,
    which is then prepared."""
    builder = tfds.builder(name, data_dir=data_dir)
    features = builder.info.features
    out = builder.data_path
    out.mkdir(parents=True, exist_ok=True)
    split_infos = []
    for split, examples in splits.items():
        lengths, sizes = [], []
        for index, part in enumerate(np.array_split(np.arange(len(examples)), files_per_split)):
            path = out / f"{builder.name}-{split}.tfrecord-{index:05d}-of-{files_per_split:05d}"
            records = [features.serialize_example(examples[i]) for i in part]
            with tf.io.TFRecordWriter(str(path)) as writer:
                for record in records:
                    writer.write(record)
            lengths.append(len(records))
            sizes.append(sum(map(len, records)))
        split_infos.append(tfds.core.SplitInfo(name=split, shard_lengths=lengths,
                                               num_bytes=sum(sizes)))
    tfds.folder_dataset.write_metadata(data_dir=out, features=features, split_infos=split_infos,
                                       version=builder.version, check_data=False)
    written = tfds.builder(name, data_dir=data_dir)
    assert written.is_prepared(), f"{name} in {data_dir} is not a prepared TFDS dataset"
    return written


def cifar10_examples(count, seed=0):
    """`count` learnable cifar10-format examples: a 12x12 square of the
    class's own hue at a random place on grey noise (labels cycle 0..9)."""
    rng = np.random.default_rng(seed)
    hues = np.arange(10) / 10
    palette = np.stack([_hue_to_rgb(h) for h in hues]) * 255
    examples = []
    for i in range(count):
        label = i % 10
        image = rng.normal(128, 40, (32, 32, 3))
        top, left = rng.integers(0, 32 - 12, size=2)
        image[top:top + 12, left:left + 12] = palette[label] + rng.normal(0, 20, (12, 12, 3))
        examples.append({"id": f"synthetic_{i}", "label": label,
                         "image": np.clip(image, 0, 255).astype(np.uint8)})
    return examples


POSITIVE_WORDS = ["great", "wonderful", "superb", "moving", "brilliant", "delightful", "loved"]
NEGATIVE_WORDS = ["awful", "boring", "terrible", "dull", "waste", "hated", "clumsy"]
NEUTRAL_WORDS = ["the", "movie", "film", "plot", "actor", "scene", "story", "was", "and", "it",
                 "director", "ending", "music", "camera", "a", "of", "this", "cast"]


def imdb_reviews_examples(count, seed=0):
    """`count` learnable imdb_reviews-format examples: neutral words with a
    few of the sentiment's own (labels alternate 0 negative, 1 positive),
    in mixed case with punctuation and `<br />` as in the real reviews."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(count):
        label = i % 2
        sentiment = POSITIVE_WORDS if label else NEGATIVE_WORDS
        words = list(rng.choice(NEUTRAL_WORDS, rng.integers(8, 30)))
        for word in rng.choice(sentiment, 3):
            words.insert(rng.integers(0, len(words) + 1), word.capitalize())
        text = " ".join(words).replace(" it ", " it. <br /><br />", 1) + "!"
        examples.append({"text": text, "label": label})
    return examples


def _hue_to_rgb(hue):
    """A fully saturated color of `hue` in [0, 1)."""
    return np.clip(np.abs((hue * 6 + np.array([0, 4, 2])) % 6 - 3) - 1, 0, 1)
