"""wide_and_deep: click-through prediction with a Wide & Deep recommender
(Cheng et al., 2016, "Wide & Deep Learning for Recommender Systems"), the
workload recommendation systems train with Horovod: a large sparse embedding
table plus dense features.

Data, in the schema of Criteo's display-advertising logs: a click label, 13
integer count features and 26 categorical features.
- With --data_dir: TFRecord files of tf.train.Example records, training
  files matching --option=train_pattern (default train-*.tfrecord) and
  validation files matching --option=eval_pattern (eval-*.tfrecord) in that
  directory; each worker reads whole files (hvdtrain.data.from_tfrecords).
  Each record has
    label        int64 list of 1: the click, 0 or 1
    dense        int64 list of 13: Criteo's I1..I13 (a missing value as 0;
                 negative values are read as 0)
    categorical  int64 list of 26: Criteo's C1..C26, each 8-hex-digit value
                 as an integer (int(value, 16)), a missing one as -1
  Converting Criteo's TSV (label, I1..I13, C1..C26 separated by tabs) is one
  tf.train.Example per line with these three features. Before training, the
  workers check every record (in parallel, each a part of the files): a
  record off the schema, or a file cut short or damaged, stops all of them
  with one line naming the file.
- Without --data_dir: a synthetic click log generated from --seed
  (--option=synthetic_examples training examples plus a tenth as many for
  validation), with heavy-tailed (Zipf-like) category ids and clicks drawn
  from a hidden logistic model over a few categorical features, one crossed
  pair of features and two dense features, so there is a signal to learn:
  validation AUC rises well above 0.5 (tests/ranked/test_wide_and_deep.py
  checks the bar). Every worker generates the same log and trains on its
  rows r, r+n, ... (hvdtrain.data.from_arrays).

Model. Categorical ids are hashed inside the model (the exported model takes
the raw ids) into ONE embedding table of --option=table_rows rows of
--option=embedding_dim values (default 2**20 x 16 float32 = 64 MB): feature k
gets its own range of table_rows // 26 rows, so features never collide with
each other, and an id's row within the range is a fingerprint of (k, id).
Deep part: the 26 embeddings and the normalized dense features (log(1 + x),
then batch normalization) through an MLP (--option=hidden_units, default
512,256,128) to one logit. Wide part: a linear model over the 26 hashed
features and crossed pairs of them (--option=crosses), itself an embedding
table of dimension 1 with one range per feature or cross. The logit is the
sum of both; loss binary cross-entropy; metrics AUC and binary accuracy.

Embeddings. --option=embeddings=replicated (the default) keeps both tables
whole on every worker, data-parallel. --option=embeddings=sharded splits
each table by rows across the workers (hvdtrain.layers.ShardedEmbedding):
each worker holds 1/N of it, lookups and their gradients travel by
alltoall, and the optimizer updates only the rows a step looked up (Adam
becomes lazy Adam; sgd and adagrad are the same as replicated). The rest
of the model stays data-parallel. bench/sharded_embeddings.py compares the
two.

Gradient exchange, replicated. The embedding tables' gradients are tf.IndexedSlices: one
row per looked-up id. hvdtrain's DistributedOptimizer allgathers them (each
worker sends batch x 26 rows of embedding_dim values plus their indices,
about 0.9 MB at batch 512 and dimension 16, and receives every other
worker's), where --sparse_as_dense turns them into dense tensors first and
allreduces the whole table's gradient (64 MB at the default size) every
step. The allgather moves less the larger the table and the smaller the
batch; its volume grows with the number of workers, the allreduce's does
not, so at very large batches x workers or small tables dense can win.
Note that Keras 3's Adam (and SGD with momentum) on TensorFlow turns an
IndexedSlices gradient into a dense one inside its update (its moment
estimates decay on every row, as in the paper's Adam), so every step still
updates the whole table and its two moment tables locally; only the exchange
is sparse. Plain SGD (--optimizer=sgd --momentum=0) updates only the rows
looked up.

Defaults: Adam, batch 512 per worker, learning rate 0.001 per worker
(scaled by the workers) after a warm-up of half an epoch, 1 epoch: with
embedding tables this large, click models overfit from the second epoch on
(validation AUC falls while training AUC climbs; the synthetic log shows it
too), which is why CTR models are commonly trained for one epoch. On the
Criteo display-advertising challenge data the DeepFM paper (Guo et al.,
2017) reports an AUC of about 0.80 for Wide & Deep; the Wide & Deep paper
itself reports results on Google Play, not Criteo.

Launch (4 workers, synthetic data; then a converted Criteo log):
  horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 python recipes/wide_and_deep.py
  horovodrun --config-file horovodrun.cfg -np 4 -H localhost:4 \\
      hvdtrain train --recipe=wide_and_deep --data_dir=/data/criteo_tfrecords
"""

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdtrain.config import POSITIVE, Range
from hvdtrain.data import from_arrays, from_tfrecords, input_errors
from hvdtrain.data.files import tfrecord_problem
from hvdtrain.errors import UsageError
from hvdtrain.layers import ShardedEmbedding
from hvdtrain.parallel import collectives
from hvdtrain.recipe import Option, Recipe, Splits

DENSE_FEATURES = 13
CATEGORICAL_FEATURES = 26

# Parsed whole: a record whose lists have other lengths fails to parse.
SCHEMA = {
    "label": tf.io.FixedLenFeature([1], tf.int64),
    "dense": tf.io.FixedLenFeature([DENSE_FEATURES], tf.int64),
    "categorical": tf.io.FixedLenFeature([CATEGORICAL_FEATURES], tf.int64),
}
SCHEMA_TEXT = (f"label int64 x1 (0 or 1), dense int64 x{DENSE_FEATURES}, "
               f"categorical int64 x{CATEGORICAL_FEATURES}")
CHECK_BATCH = 4096  # records parsed at once when checking the files


@keras.saving.register_keras_serializable(package="wide_and_deep")
class HashedFeatures(keras.layers.Layer):
    """Rows of one table shared by `features` categorical features and by
    `crosses` (pairs of feature indices): output column k (features first,
    then crosses) takes rows [k * R, (k + 1) * R), R = rows // columns, the
    row within that range a fingerprint of (k, id) — or (k, id_a, id_b) for
    a cross. Deterministic: the same ids always take the same rows."""

    def __init__(self, rows, features=CATEGORICAL_FEATURES, crosses=(), **kwargs):
        super().__init__(**kwargs)
        self.rows, self.features = rows, features
        self.crosses = tuple(tuple(pair) for pair in crosses)
        self.columns = features + len(self.crosses)
        self.rows_per_column = rows // self.columns

    def call(self, ids):
        text = tf.strings.as_string(ids)
        columns = [text[:, k] for k in range(self.features)] + [
            tf.strings.join([text[:, a], text[:, b]], separator="x") for a, b in self.crosses]
        keys = tf.stack(columns, axis=1)
        # The column in the key too: an id common to two features (or a
        # colliding pair) does not land on the same relative row in both.
        prefixes = tf.constant([f"{k}:" for k in range(self.columns)])
        keys = tf.strings.join([tf.broadcast_to(prefixes, tf.shape(keys)), keys])
        offsets = tf.range(self.columns, dtype=tf.int64) * self.rows_per_column
        return tf.strings.to_hash_bucket_fast(keys, self.rows_per_column) + offsets

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.columns)

    def get_config(self):
        return {**super().get_config(), "rows": self.rows, "features": self.features,
                "crosses": [list(pair) for pair in self.crosses]}


@keras.saving.register_keras_serializable(package="wide_and_deep")
class ClickAUC(keras.metrics.AUC):
    """AUC of click logits."""

    def __init__(self, name="auc", from_logits=True, **kwargs):
        super().__init__(name=name, from_logits=from_logits, **kwargs)


@keras.saving.register_keras_serializable(package="wide_and_deep")
class ClickAccuracy(keras.metrics.BinaryAccuracy):
    """Binary accuracy of click logits: a logit above 0 is p > 0.5."""

    def __init__(self, name="accuracy", threshold=0.0, **kwargs):
        super().__init__(name=name, threshold=threshold, **kwargs)


def check(config):
    """The options' formats, the table's size for the crosses, and the
    settings that sharded tables cannot follow."""
    options = config.options
    rows, crosses = options["table_rows"], parse_crosses(options["crosses"])
    parse_units(options["hidden_units"])
    if rows < CATEGORICAL_FEATURES + len(crosses):
        raise UsageError(f"--option=table_rows={rows} must be at least one row per feature "
                         f"and cross ({CATEGORICAL_FEATURES + len(crosses)})")
    if options["embeddings"] == "sharded":
        config.check_sharded_tables()


def build_model(config):
    options = config.options
    rows, crosses = options["table_rows"], parse_crosses(options["crosses"])
    hidden_units = parse_units(options["hidden_units"])
    layers, ops = keras.layers, keras.ops
    dense = keras.Input((DENSE_FEATURES,), name="dense")
    categorical = keras.Input((CATEGORICAL_FEATURES,), dtype="int64", name="categorical")

    counts = layers.BatchNormalization(name="dense_normalization")(
        ops.log1p(ops.maximum(dense, 0.0)))
    table = layers.Embedding if options["embeddings"] == "replicated" else ShardedEmbedding
    deep_rows = HashedFeatures(rows, name="deep_hashing")(categorical)
    embedded = table(rows, options["embedding_dim"], name="deep_embedding")(deep_rows)
    x = layers.Concatenate(name="deep_inputs")([layers.Flatten()(embedded), counts])
    for i, units in enumerate(hidden_units):
        x = layers.Dense(units, activation="relu", name=f"hidden_{i + 1}")(x)
    deep_logit = layers.Dense(1, name="deep_logit")(x)

    wide_rows = HashedFeatures(rows, crosses=crosses, name="wide_hashing")(categorical)
    weights = table(rows, 1, embeddings_initializer="zeros", name="wide_weights")(wide_rows)
    wide_logit = ops.sum(weights, axis=1)
    # The logit in float32 under mixed precision.
    logit = layers.Add(dtype="float32", name="logit")([deep_logit, wide_logit])
    return keras.Model({"dense": dense, "categorical": categorical}, logit, name="wide_and_deep")


def parse_crosses(text):
    """[(a, b), ...] from "AxB,CxD" (feature indices)."""
    try:
        pairs = [tuple(int(i) for i in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        pairs = [()]
    if any(len(p) != 2 or not all(0 <= i < CATEGORICAL_FEATURES for i in p) for p in pairs):
        raise UsageError(f"--option=crosses={text}: expected pairs of feature indices 0 to "
                         f"{CATEGORICAL_FEATURES - 1} like 0x1,2x3 (or empty for none)")
    return pairs


def parse_units(text):
    try:
        units = [int(u) for u in text.split(",")]
    except ValueError:
        units = [0]
    if not all(u > 0 for u in units):
        raise UsageError(f"--option=hidden_units={text}: expected positive layer widths "
                         "like 512,256,128")
    return units


def load_data(config):
    if config.data_dir:
        return _tfrecord_splits(config)
    examples = config.options["synthetic_examples"]
    features, labels = synthetic_click_log(examples + examples // 10, config.seed)
    train = ({k: v[:examples] for k, v in features.items()}, labels[:examples])
    validation = ({k: v[examples:] for k, v in features.items()}, labels[examples:])
    return Splits(
        train=from_arrays(train, config.batch_size, training=True, seed=config.seed),
        validation=from_arrays(validation, config.batch_size, training=False))


def synthetic_click_log(examples, seed):
    """({"dense": float32 [n, 13], "categorical": int64 [n, 26]}, clicks
    float32 [n, 1]): the same for the same (examples, seed).

    Feature k's ids are ranks 1..vocabulary[k] drawn from a power law (rank
    r about r**-1.1 as likely), scrambled into 32-bit values like Criteo's.
    Clicks follow a hidden logistic model: a weight per id of features 0-3,
    a weight per pair of ids of features 4 and 5 (no weight on either
    alone: only the cross, or the MLP, can learn it) and two dense counts.
    """
    # The hidden model from its own stream: the same whatever `examples`.
    hidden, rng = (np.random.default_rng([seed, stream]) for stream in (0, 1))
    vocabulary = np.concatenate([[50, 200, 1_000, 5_000, 20, 20],
                                 np.geomspace(100, 3_000_000, CATEGORICAL_FEATURES - 6)])
    id_weights = [hidden.normal(0.0, 0.5, int(v) + 1) for v in vocabulary[:4]]
    cross_weights = hidden.normal(0.0, 0.8, (21, 21))
    scramble = hidden.integers(0, 2**31, CATEGORICAL_FEATURES) * 2 + 1  # odd: a bijection mod 2**32
    shift = hidden.integers(0, 2**32, CATEGORICAL_FEATURES)

    ranks = np.stack([_power_law(rng, int(v), examples) for v in vocabulary], axis=1)
    categorical = (ranks * scramble + shift) % 2**32
    scale = np.linspace(0.0, 4.0, DENSE_FEATURES)
    dense = np.floor(np.exp(rng.normal(scale, 1.2, (examples, DENSE_FEATURES))))
    dense[rng.random((examples, DENSE_FEATURES)) < 0.2] = 0  # missing

    log_counts = np.log1p(dense)
    logit = -1.1 + 0.6 * log_counts[:, 0] - 0.4 * log_counts[:, 5]
    for k, weights in enumerate(id_weights):
        logit += weights[ranks[:, k]]
    logit += cross_weights[ranks[:, 4], ranks[:, 5]]
    clicks = rng.random(examples) < 1 / (1 + np.exp(-logit))
    return ({"dense": dense.astype(np.float32), "categorical": categorical.astype(np.int64)},
            clicks.astype(np.float32)[:, None])


def _power_law(rng, vocabulary, count, exponent=1.1):
    """Ranks 1..vocabulary, P(r) falling as r**-exponent (continuous inverse CDF)."""
    top = (vocabulary + 1.0) ** (1 - exponent)
    ranks = (1 + (top - 1) * rng.random(count)) ** (1 / (1 - exponent))
    return np.minimum(ranks.astype(np.int64), vocabulary)


def _tfrecord_splits(config):
    directory = config.data_dir.rstrip("/")
    patterns = [f"{directory}/{config.options[name]}" for name in ("train_pattern", "eval_pattern")]
    check_records(sorted(f for p in patterns for f in tf.io.gfile.glob(p)))
    common = dict(batch_size=config.batch_size, seed=config.seed,
                  deterministic=config.deterministic)
    return Splits(train=from_tfrecords(patterns[0], parse, training=True, **common),
                  validation=from_tfrecords(patterns[1], parse, training=False, **common))


def parse(record, seed):
    example = tf.io.parse_single_example(record, SCHEMA)
    features = {"dense": tf.cast(example["dense"], tf.float32),
                "categorical": example["categorical"]}
    return features, tf.cast(example["label"], tf.float32)


def check_records(files):
    """Raises the same UsageError on every worker if any record of `files`
    is off the schema; each worker checks every n-th file."""
    error = None
    for path in files[hvd.rank()::hvd.size()]:
        error = _check_file(path)
        if error:
            break
    collectives.raise_together(error)


def _check_file(path):
    records = tf.data.TFRecordDataset(path).batch(CHECK_BATCH)
    try:
        for batch in records:
            labels = tf.io.parse_example(batch, SCHEMA)["label"]
            if not bool(tf.reduce_all((labels == 0) | (labels == 1))):
                return UsageError(f"{path}: a label is not 0 or 1; expected {SCHEMA_TEXT}")
    except tf.errors.DataLossError as e:  # cut short or damaged, whatever its records hold
        return UsageError(tfrecord_problem(path, e))
    except tf.errors.InvalidArgumentError as e:
        # TensorFlow's reason without its op names: "Key: dense, Index: 1. Number of ..."
        reason = input_errors.reason(e).replace("Name: <unknown>, ", "")
        return UsageError(f"{path} has a record off the schema ({reason}); expected "
                          f"{SCHEMA_TEXT} (see recipes/wide_and_deep.py)")
    return None


RECIPE = Recipe(
    name="wide_and_deep",
    build_model=build_model,
    load_data=load_data,
    loss=keras.losses.BinaryCrossentropy(from_logits=True),
    # Classes, made by the trainer: a Metric made at import would start
    # TensorFlow's runtime before hvdtrain.init() sets its threads.
    metrics=(ClickAUC, ClickAccuracy),
    defaults=dict(epochs=1, batch_size=512, learning_rate=0.001, optimizer="adam",
                  warmup_epochs=0.5),
    options={
        "table_rows": Option(2**20, "rows of the shared embedding table (and of the wide "
                                    "part's); each feature gets 1/26 of them", allowed=Range(26)),
        "embedding_dim": Option(16, "values per embedding row", allowed=POSITIVE),
        "embeddings": Option("replicated", "the tables whole on every worker (replicated), or "
                                           "split by rows across the workers (sharded)",
                             choices=("replicated", "sharded")),
        "hidden_units": Option("512,256,128", "widths of the deep part's hidden layers"),
        "crosses": Option("0x1,2x3,4x5", "crossed pairs of categorical features in the wide "
                                         "part, as AxB,CxD (indices 0-25)"),
        "synthetic_examples": Option(200_000, "training examples of the synthetic click log "
                                              "(without --data_dir); plus a tenth to validate",
                                     allowed=POSITIVE),
        "train_pattern": Option("train-*.tfrecord", "training files in --data_dir"),
        "eval_pattern": Option("eval-*.tfrecord", "validation files in --data_dir"),
    },
    unit="examples",
    check=check,
)

if __name__ == "__main__":
    from hvdtrain import cli

    cli.run_recipe(RECIPE.name)
