"""An embedding table split across workers: model parallelism for the
tables that data parallelism would copy onto every worker.

Each worker holds the rows its `split_variables.Placement` gives it. A lookup sends
each id to the worker that owns its row and the rows back, with Horovod's
`alltoall`:

    ids -> unique ids -> sorted by owner -> alltoall -> owners gather rows
        -> alltoall back -> each id's row

Autodiff runs the same path backwards: the gradients of the rows travel back
to their owners (the second alltoall's gradient), where they arrive as a
`tf.IndexedSlices` on the local shard. The distributed optimizer applies
those to the looked-up rows only (sparse_updates.py) and never
allreduces them; every other variable is averaged as usual.

Every worker must call the layer equally often: a lookup is a collective,
which is why evaluation gives every worker the same number of batches.
"""

import zlib

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.errors import MODEL_INPUT, UsageError
from hvdtrain.parallel import collectives, split_variables
from hvdtrain.parallel.sharded_tables import memory

__all__ = ["PLACEMENTS", "ShardedEmbedding"]

PLACEMENTS = ("rows", "table")
# Per id and destination: [the sender has a bad id, that id]; sent with the
# ids, so every worker learns of a bad id in the same step without another
# collective, and all stop together.
_HEADER = 2


@keras.saving.register_keras_serializable(package="hvdtrain")
class ShardedEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` whose table is split across the workers.

    Args:
        input_dim: Rows of the table (ids run from 0 to input_dim - 1).
        output_dim: Width of each row.
        placement: "rows" splits the table by rows over all workers (row r on
            worker r % N), for a huge table; "table" keeps it whole on one
            worker, for many tables spread over the workers.
        owner: With placement "table", the worker holding it; None: the
            layer's name decides (a hash, the same on every worker and run).
        embeddings_initializer: As for `keras.layers.Embedding`; each worker
            initialises its own rows, a random initializer from a seed of
            its own (the initializer's seed and the worker's rank).
        mask_zero: As for `keras.layers.Embedding`.
        **kwargs: Layer arguments (name, dtype, ...).

    Raises:
        UsageError: At build, on every worker, if a worker's shard does not
            fit the memory it has (naming the size it needs).
    """

    def __init__(self, input_dim, output_dim, placement="rows", owner=None,
                 embeddings_initializer="uniform", mask_zero=False, **kwargs):
        super().__init__(**kwargs)
        if placement not in PLACEMENTS:
            raise UsageError(f"ShardedEmbedding: placement must be one of "
                             f"{', '.join(PLACEMENTS)}, got {placement!r}")
        if not (isinstance(input_dim, int) and input_dim > 0
                and isinstance(output_dim, int) and output_dim > 0):
            raise UsageError(f"ShardedEmbedding: input_dim and output_dim must be positive "
                             f"integers, got {input_dim!r} and {output_dim!r}")
        self.input_dim, self.output_dim = input_dim, output_dim
        self.placement_kind, self.owner = placement, owner
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero

    @property
    def placement(self):
        owner = None
        if self.placement_kind == "table":
            owner = self.owner if self.owner is not None else zlib.crc32(self.name.encode())
        return split_variables.Placement(self.input_dim, owner)

    def build(self, input_shape=None):
        if layout.tensor_size() > 1 or layout.pipeline_size() > 1:
            # Its lookups go to every worker, and a replica's ranks would
            # each send the same ids (or only one stage would look them up).
            raise UsageError(f"ShardedEmbedding '{self.name}' shards over all workers, not "
                             "by replica: with --tensor_parallel or --pipeline_parallel, split "
                             "the table with hvdtrain.layers.VocabParallelEmbedding")
        rows = self.placement.shard_rows(hvd.rank(), hvd.size())
        memory.refuse_too_large(f"embedding table '{self.name}'",
                                rows * self.output_dim * tf.as_dtype(self.variable_dtype).size)
        self.embeddings = split_variables.mark(
            self.add_weight(shape=(rows, self.output_dim), name="embeddings", trainable=True,
                            initializer=_own_stream(self.embeddings_initializer, hvd.rank())),
            self.placement)
        self.built = True

    def call(self, inputs):
        ids = tf.cast(inputs, tf.int64)
        unique, positions = tf.unique(tf.reshape(ids, [-1]))
        rows = self._rows_of(unique)
        outputs = tf.gather(tf.cast(rows, self.compute_dtype), positions)
        return tf.reshape(outputs, tf.concat([tf.shape(ids, tf.int64), [self.output_dim]], 0))

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs, 0) if self.mask_zero else None

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim,
                "output_dim": self.output_dim, "placement": self.placement_kind,
                "owner": self.owner, "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer)}

    def plain_layer(self):
        """The `keras.layers.Embedding` this layer is, whole (for export)."""
        return keras.layers.Embedding(self.input_dim, self.output_dim, mask_zero=self.mask_zero,
                                      name=self.name)

    def _rows_of(self, unique):
        """The table's rows for `unique` ids, from the workers that own them."""
        size = hvd.size()
        bad = tf.logical_or(unique < 0, unique >= self.input_dim)
        if size == 1:
            with tf.control_dependencies([self._check(bad, unique)]):
                return tf.gather(self.embeddings, unique)
        placement = self.placement
        owners = (unique % size if placement.owner is None
                  else tf.fill(tf.shape(unique), tf.cast(placement.owner % size, tf.int64)))
        owners = tf.where(bad, tf.zeros_like(owners), owners)
        order = tf.argsort(owners, stable=True)
        sent_ids = tf.gather(tf.where(bad, tf.zeros_like(unique), unique), order)
        counts = tf.math.bincount(tf.cast(owners, tf.int32), minlength=size, maxlength=size)
        header = tf.stack([tf.cast(tf.reduce_any(bad), tf.int64),
                           tf.reduce_max(tf.where(bad, unique, tf.int64.min))])
        with collectives.root_name_scope():
            received, received_counts = hvd.alltoall(
                _with_headers(sent_ids, counts, header, size), splits=counts + _HEADER,
                name=f"hvdtrain.embedding.{self.name}.ids")
        received_ids, headers = _without_headers(received, received_counts)
        with tf.control_dependencies([self._check(headers[:, 0] > 0, headers[:, 1])]):
            local = (received_ids // size if placement.owner is None else received_ids)
            # In the variable's dtype: Keras's autocast would read bfloat16 under
            # mixed_bfloat16, which Horovod's alltoall does not carry.
            vectors = tf.cast(tf.gather(self.embeddings, local), self.variable_dtype)
        returned = _exchange(vectors, received_counts - _HEADER,
                             f"hvdtrain.embedding.{self.name}.rows")
        # Back in the order the ids were sent: undo the sort.
        return tf.gather(returned, tf.math.invert_permutation(tf.cast(order, tf.int32)))

    def _check(self, bad, ids):
        """Fails, on every worker alike, if any of `bad` holds: `ids` at the
        same positions are out of the table's range."""
        first = tf.gather(ids, tf.argmax(tf.cast(bad, tf.int32)))
        template = (f"{MODEL_INPUT}embedding table '{self.name}' got id {{}}, outside "
                    f"[0, {self.input_dim}): check the ids the input pipeline feeds it, or make "
                    "input_dim larger")
        return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)),
                                   [tf.strings.format(template, first)])


def _own_stream(initializer, rank):
    """`initializer` drawing from a stream of `rank`'s own: from one seed,
    every worker would draw the same values, and rows r and r + 1 (on two
    workers) would start alike."""
    # Keras's random initializers hold their seed; its base class is not public.
    if isinstance(getattr(initializer, "seed", None), int) and "seed" in initializer.get_config():
        return initializer.__class__.from_config(
            {**initializer.get_config(), "seed": (initializer.seed * 1_000_003 + rank) % 2**31})
    return initializer


def _with_headers(ids, counts, header, size):
    """`ids` (sorted by destination, `counts` for each) with `header` before
    each destination's part."""
    starts = tf.cumsum(counts + _HEADER, exclusive=True)
    sorted_owner = tf.repeat(tf.range(size), counts)
    within = tf.range(tf.shape(ids)[0]) - tf.gather(tf.cumsum(counts, exclusive=True),
                                                    sorted_owner)
    id_positions = tf.gather(starts, sorted_owner) + _HEADER + within
    header_positions = tf.reshape(starts[:, None] + tf.range(_HEADER)[None, :], [-1])
    return tf.scatter_nd(
        tf.concat([id_positions, header_positions], 0)[:, None],
        tf.concat([ids, tf.tile(header, [size])], 0),
        [tf.shape(ids)[0] + _HEADER * size])


def _without_headers(received, counts):
    """(the ids in `received`, [sender, _HEADER] headers) of what every
    sender sent with _with_headers."""
    starts = tf.cumsum(counts, exclusive=True)
    header_positions = starts[:, None] + tf.range(_HEADER)[None, :]
    headers = tf.gather(received, header_positions)
    is_id = tf.tensor_scatter_nd_update(
        tf.ones_like(received, tf.bool), tf.reshape(header_positions, [-1, 1]),
        tf.zeros([tf.size(header_positions)], tf.bool))
    return tf.boolean_mask(received, is_id), headers


def _exchange(vectors, counts, name):
    """The rows each worker asked for, sent back by an alltoall whose
    gradient (an alltoall the other way) has a name of its own, the same on
    every worker."""

    @tf.custom_gradient
    def exchange(sent):
        with collectives.root_name_scope():
            returned, received_counts = hvd.alltoall(sent, splits=counts, name=name)

        def backward(gradient):
            with collectives.root_name_scope():
                back, _ = hvd.alltoall(gradient, splits=received_counts, name=f"{name}.grad")
            return back

        return returned, backward

    return exchange(vectors)
