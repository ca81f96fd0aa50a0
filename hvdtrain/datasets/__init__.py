"""TFDS datasets that hvdtrain builds locally, from data its dependencies ship."""
