"""Keras layers for training across workers, from every strategy in
hvdtrain.parallel, under one public name. It depends on those strategies;
recipes and users' models depend on it."""

from hvdtrain.parallel.embedding.sharded_embedding import ShardedEmbedding, replicated_copy

__all__ = ["ShardedEmbedding", "replicated_copy"]
