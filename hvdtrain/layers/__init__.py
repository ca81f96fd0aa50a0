"""Keras layers for training across workers, from every strategy in
hvdtrain.parallel, under one public name. It depends on those strategies;
recipes and users' models depend on it."""

from hvdtrain.parallel.sharded_tables.sharded_embedding import ShardedEmbedding
from hvdtrain.parallel.split_variables import replicated_copy
from hvdtrain.parallel.tensor_parallel.attention import ParallelMultiHeadAttention
from hvdtrain.parallel.tensor_parallel.dense import ColumnParallelDense, RowParallelDense
from hvdtrain.parallel.tensor_parallel.loss import (
    VocabParallelSparseCategoricalCrossentropy,
    vocab_parallel_sparse_categorical_crossentropy,
)
from hvdtrain.parallel.tensor_parallel.split_weights import set_whole_weights
from hvdtrain.parallel.tensor_parallel.vocab_embedding import VocabParallelEmbedding

__all__ = ["ColumnParallelDense", "ParallelMultiHeadAttention", "RowParallelDense",
           "ShardedEmbedding", "VocabParallelEmbedding",
           "VocabParallelSparseCategoricalCrossentropy", "replicated_copy", "set_whole_weights",
           "vocab_parallel_sparse_categorical_crossentropy"]
