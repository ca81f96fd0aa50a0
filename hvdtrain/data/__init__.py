"""Input pipelines that give each worker its own shard and every worker the
same number of training steps. They depend on runtime and parallel's
collectives (the workers agree on counts); recipes and run depend on them."""

from hvdtrain.data.arrays import from_arrays
from hvdtrain.data.files import from_image_folder, from_tfrecords
from hvdtrain.data.sharded_dataset import ShardedDataset
from hvdtrain.data.synthetic import synthetic
from hvdtrain.data.tfds_source import from_tfds

__all__ = ["ShardedDataset", "from_arrays", "from_image_folder", "from_tfds", "from_tfrecords",
           "synthetic"]
