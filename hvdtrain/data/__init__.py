"""Input pipelines that give each worker its own shard and every worker the
same number of training steps."""

from hvdtrain.data.arrays import from_arrays
from hvdtrain.data.sharding import ShardedDataset

__all__ = ["ShardedDataset", "from_arrays"]
