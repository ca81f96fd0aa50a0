"""Embedding tables sharded by rows across the workers (ShardedEmbedding,
public as hvdtrain.layers.ShardedEmbedding), their sparse optimizer updates,
and the check that a table's shard fits in memory. Depends on parallel's
collectives and placement; the data-parallel optimizer depends on it.
"""
