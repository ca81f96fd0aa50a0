"""TFDS datasets that hvdtrain builds locally, from data its dependencies ship.
They depend on nothing else in hvdtrain; recipes depend on them."""
