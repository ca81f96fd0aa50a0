"""Keras layers for training across workers."""

from hvdtrain.layers.sharded_embedding import ShardedEmbedding, replicated_copy

__all__ = ["ShardedEmbedding", "replicated_copy"]
