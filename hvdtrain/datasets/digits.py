"""`hvdtrain_digits`: the UCI handwritten digits that scikit-learn ships
(1,797 8x8 grey images of 10 classes), as a TFDS dataset with a fixed
train/validation split. Building it needs no network, so the default recipe
reads its data through the same TFDS path as cifar10 or imagenet2012 would.
"""

import numpy as np
import tensorflow_datasets as tfds
from sklearn.datasets import load_digits

from hvdtrain.datasets.builds import build_once

__all__ = ["HvdtrainDigits", "prepare"]

VALIDATION_FRACTION = 0.2
SPLIT_SEED = 0
# Several files per split, so that workers read whole files, as they do on
# real datasets (up to this many workers).
FILES_PER_SPLIT = 8


class HvdtrainDigits(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "scikit-learn's digits, 80/20 train/validation split."}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1)),
                "label": tfds.features.ClassLabel(num_classes=10),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        digits = load_digits()
        images = np.round(digits.images * 255 / 16).astype(np.uint8)[..., np.newaxis]
        order = np.random.default_rng(SPLIT_SEED).permutation(len(images))
        num_validation = round(len(images) * VALIDATION_FRACTION)
        return {
            "train": self._generate_examples(images, digits.target, order[num_validation:]),
            "validation": self._generate_examples(images, digits.target, order[:num_validation]),
        }

    def _generate_examples(self, images, labels, indices):
        for i in indices:
            yield int(i), {"image": images[i], "label": int(labels[i])}


def prepare(data_dir=None):
    """Builds the dataset in `data_dir` (TFDS's default when None) unless it is there."""
    tfds.disable_progress_bar()
    return build_once(lambda: HvdtrainDigits(data_dir=data_dir),
                      download_config=tfds.download.DownloadConfig(num_shards=FILES_PER_SPLIT))
