"""TFDS datasets that hvdtrain builds locally, from data its dependencies ship,
and how any TFDS dataset is built once when several jobs ask at the same
time. They depend on nothing else in hvdtrain; recipes and data/ depend on them."""
