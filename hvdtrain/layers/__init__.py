"""Keras layers for training across workers, from every strategy in
hvdtrain.parallel, under one public name. It depends on those strategies;
recipes and users' models depend on it."""

from hvdtrain.parallel.embedding.sharded_embedding import ShardedEmbedding
from hvdtrain.parallel.sharding import replicated_copy
from hvdtrain.parallel.tensor.attention import ParallelMultiHeadAttention
from hvdtrain.parallel.tensor.dense import ColumnParallelDense, RowParallelDense
from hvdtrain.parallel.tensor.embedding import VocabParallelEmbedding
from hvdtrain.parallel.tensor.loss import (
    VocabParallelSparseCategoricalCrossentropy,
    vocab_parallel_sparse_categorical_crossentropy,
)
from hvdtrain.parallel.tensor.weights import set_whole_weights

__all__ = ["ColumnParallelDense", "ParallelMultiHeadAttention", "RowParallelDense",
           "ShardedEmbedding", "VocabParallelEmbedding",
           "VocabParallelSparseCategoricalCrossentropy", "replicated_copy", "set_whole_weights",
           "vocab_parallel_sparse_categorical_crossentropy"]
