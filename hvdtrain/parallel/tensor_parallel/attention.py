"""Multi-head attention with its heads split over the replica's ranks.

Each rank projects its inputs to its num_heads / T heads' queries, keys and
values (column-parallel: the projections' kernels split by heads), attends
with them alone, and projects its heads' outputs with its rows of the
output kernel (row-parallel); one allreduce sums the ranks' partial outputs.
The weights have the shapes and order of `keras.layers.MultiHeadAttention`'s,
split: the layer exports to one, and is called like one.
"""

import math

import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.parallel.tensor_parallel import operators, split_weights

__all__ = ["ParallelMultiHeadAttention"]

# Apart enough that no two ranks' dropout streams meet.
_STREAM_STRIDE = 1_000_003


@keras.saving.register_keras_serializable(package="hvdtrain")
class ParallelMultiHeadAttention(keras.layers.Layer):
    """`keras.layers.MultiHeadAttention` with its heads split over the replica's ranks.

    Args:
        num_heads: Attention heads of the whole layer (divisible by T).
        key_dim: Size of each head's queries and keys (and values).
        dropout: Dropout rate of the attention probabilities. Inside the
            split region, so each tensor-parallel rank draws its own stream
            (its heads are its own); replicas draw alike, as in Megatron-LM.
        use_bias: As for `keras.layers.MultiHeadAttention`.
        kernel_initializer, bias_initializer: Likewise.
        seed: Seed of the dropout streams (None: one drawn at construction).
        **kwargs: Layer arguments (name, dtype, ...).

    Call it as `keras.layers.MultiHeadAttention`: `layer(query, value,
    key=None, attention_mask=None, use_causal_mask=False, training=None)`;
    the output has the query's last dimension.
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", seed=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.key_dim, self.dropout, self.use_bias = (num_heads, key_dim,
                                                                     dropout, use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        # The generator's state is the same on every rank (broadcast and saved
        # like any weight); each rank offsets what it draws by its own rank.
        self._seeds = keras.random.SeedGenerator(seed)
        self._softmax = keras.layers.Softmax(axis=-1, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        split_weights.check_divisible(self, "num_heads", self.num_heads)
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        heads = (self.num_heads, self.key_dim)
        for name, width in (("query", query_shape[-1]), ("key", key_shape[-1]),
                            ("value", value_shape[-1])):
            setattr(self, f"{name}_kernel", split_weights.add_split_weight(
                self, f"{name}_kernel", (width, *heads), 1, self.kernel_initializer))
            setattr(self, f"{name}_bias", split_weights.add_split_weight(
                self, f"{name}_bias", heads, 0, self.bias_initializer) if self.use_bias else None)
        self.output_kernel = split_weights.add_split_weight(
            self, "output_kernel", (*heads, query_shape[-1]), 0, self.kernel_initializer)
        self.output_bias = (self.add_weight(shape=(query_shape[-1],), name="output_bias",
                                            initializer=self.bias_initializer)
                            if self.use_bias else None)

    def call(self, query, value, key=None, attention_mask=None, use_causal_mask=False,
             training=None):
        key = value if key is None else key
        copies = {}   # one f per distinct input: self-attention sums its gradient once
        projected = {}
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if id(tensor) not in copies:
                copies[id(tensor)] = operators.copy_to_group(
                    tensor, self._collective(f"{name}.input"))
            x = keras.ops.einsum("abc,cde->abde", copies[id(tensor)],
                                 getattr(self, f"{name}_kernel"))
            projected[name] = x + getattr(self, f"{name}_bias") if self.use_bias else x
        query = projected["query"] * keras.ops.cast(1.0 / math.sqrt(self.key_dim),
                                                    projected["query"].dtype)
        scores = keras.ops.einsum("aecd,abcd->acbe", projected["key"], query)
        mask = self._mask(scores, attention_mask, use_causal_mask)
        probabilities = self._softmax(scores, mask=mask)
        if training and self.dropout > 0:
            probabilities = self._drop(probabilities)
        heads = keras.ops.einsum("acbe,aecd->abcd", probabilities, projected["value"])
        output = operators.reduce_from_group(
            keras.ops.einsum("abcd,cde->abe", heads, self.output_kernel),
            self._collective("output"))
        return output + self.output_bias if self.use_bias else output

    def _mask(self, scores, attention_mask, use_causal_mask):
        """[B, 1, T, S] of the positions to attend, as Keras's layer makes it."""
        mask = None if attention_mask is None else keras.ops.cast(attention_mask, "bool")
        if use_causal_mask:
            length_q, length_v = keras.ops.shape(scores)[-2], keras.ops.shape(scores)[-1]
            causal = keras.ops.tril(keras.ops.ones((1, length_q, length_v), "bool"))
            mask = causal if mask is None else keras.ops.logical_and(mask, causal)
        return None if mask is None else keras.ops.expand_dims(mask, axis=-3)

    def _drop(self, probabilities):
        seed = self._seeds.next()
        seed = seed + keras.ops.cast([0, _STREAM_STRIDE * layout.tensor_rank()], seed.dtype)
        keep = tf.random.stateless_uniform(tf.shape(probabilities), seed=tf.cast(seed, tf.int32),
                                           dtype=probabilities.dtype) >= self.dropout
        return tf.where(keep, probabilities / (1 - self.dropout),
                        tf.zeros_like(probabilities))

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return query_shape

    def _collective(self, what):
        return operators.collective_name(self.name, what)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "key_dim": self.key_dim,
                "dropout": self.dropout, "use_bias": self.use_bias, "seed": self.seed,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer)}

    def plain_layer(self):
        """The `keras.layers.MultiHeadAttention` this layer is, whole (for export)."""
        return keras.layers.MultiHeadAttention(self.num_heads, self.key_dim,
                                               dropout=self.dropout, use_bias=self.use_bias,
                                               name=self.name, dtype=self.dtype_policy)
