"""A vocabulary-parallel embedding, which can also be the language model's head.

The table's rows are split into T contiguous ranges, one per rank of the
replica. A lookup finds each id's row on the rank whose range holds it
(the others contribute zeros) and sums over the replica (Megatron-LM's g).
Called in reverse, the layer projects hidden states onto its rows: each rank
computes the logits of its range of the vocabulary, which a
`VocabParallelSparseCategoricalCrossentropy` takes without gathering them.
It is `keras.layers.ReversibleEmbedding`, split, and exports to one.
"""

import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.errors import MODEL_INPUT
from hvdtrain.parallel.tensor_parallel import operators, split_weights

__all__ = ["VocabParallelEmbedding", "vocabulary_range"]


def vocabulary_range(vocabulary):
    """(first, end) of the ids this rank's part of a `vocabulary` holds."""
    width = vocabulary // layout.tensor_size()
    return layout.tensor_rank() * width, (layout.tensor_rank() + 1) * width


@keras.saving.register_keras_serializable(package="hvdtrain")
class VocabParallelEmbedding(keras.layers.Layer):
    """`keras.layers.ReversibleEmbedding` with its vocabulary split over the replica's ranks.

    Args:
        input_dim: The vocabulary's size (divisible by T).
        output_dim: Width of each row.
        tie_weights: The reverse projection uses the table (True, the
            default), or a matrix of its own, split the same way.
        embeddings_initializer: As for `keras.layers.Embedding`.
        **kwargs: Layer arguments (name, dtype, ...).

    Call it as `keras.layers.ReversibleEmbedding`: `layer(ids)` looks up
    rows (whole on every rank); `layer(hidden, reverse=True)` gives this
    rank's range of the vocabulary's logits.
    """

    def __init__(self, input_dim, output_dim, tie_weights=True,
                 embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.input_dim, self.output_dim, self.tie_weights = input_dim, output_dim, tie_weights
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None):
        split_weights.check_divisible(self, "vocabulary (input_dim)", self.input_dim)
        self.embeddings = split_weights.add_split_weight(
            self, "embeddings", (self.input_dim, self.output_dim), 0,
            self.embeddings_initializer)
        self.reverse_embeddings = None if self.tie_weights else split_weights.add_split_weight(
            self, "reverse_embeddings", (self.output_dim, self.input_dim), 1,
            self.embeddings_initializer)

    def call(self, inputs, reverse=False):
        if reverse:
            x = operators.copy_to_group(inputs, self._collective("logits.input"))
            kernel = (keras.ops.transpose(self.embeddings) if self.tie_weights
                      else self.reverse_embeddings)
            return keras.ops.matmul(x, kernel)
        ids = tf.cast(inputs, tf.int32)
        first, end = vocabulary_range(self.input_dim)
        with tf.control_dependencies([self._check(ids)]):
            local = ids - first
        mine = tf.logical_and(local >= 0, local < end - first)
        rows = tf.gather(tf.cast(self.embeddings, self.compute_dtype),
                         tf.where(mine, local, tf.zeros_like(local)))
        rows = tf.where(mine[..., None], rows, tf.zeros_like(rows))
        return operators.reduce_from_group(rows, self._collective("lookup"))

    def _check(self, ids):
        """Fails on an id outside the vocabulary, as Keras's Embedding does on
        a CPU (each rank would find no row for it and give zeros)."""
        bad = tf.logical_or(ids < 0, ids >= self.input_dim)
        first = tf.gather(tf.reshape(ids, [-1]),
                          tf.argmax(tf.cast(tf.reshape(bad, [-1]), tf.int32)))
        template = (f"{MODEL_INPUT}embedding '{self.name}' got id {{}}, outside "
                    f"[0, {self.input_dim}): check the ids the input pipeline feeds it, or make "
                    "the vocabulary larger")
        return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)),
                                   [tf.strings.format(template, first)])

    def compute_output_shape(self, input_shape, reverse=False):
        if reverse:
            return (*input_shape[:-1], self.input_dim // layout.tensor_size())
        return (*input_shape, self.output_dim)

    def compute_output_spec(self, inputs, reverse=False):
        # Keras passes only the tensors' shapes to compute_output_shape.
        return keras.KerasTensor(self.compute_output_shape(inputs.shape, reverse),
                                 dtype=self.compute_dtype)

    def _collective(self, what):
        return operators.collective_name(self.name, what)

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim,
                "output_dim": self.output_dim, "tie_weights": self.tie_weights,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer)}

    def plain_layer(self):
        """The `keras.layers.ReversibleEmbedding` this layer is, whole (for export)."""
        return keras.layers.ReversibleEmbedding(self.input_dim, self.output_dim,
                                                tie_weights=self.tie_weights, name=self.name,
                                                dtype=self.dtype_policy)
