"""The wide_and_deep recipe in one process: sparse embedding gradients,
per-feature hashing, the synthetic click log and the TFRecord schema check."""

import re

import numpy as np
import pytest
import tensorflow as tf
from hvdtrain.recipes import wide_and_deep

import hvdtrain
from hvdtrain import recipe
from hvdtrain.errors import UsageError

TINY = {"table_rows": 2000, "embedding_dim": 4, "hidden_units": "16", "crosses": "0x1,4x5"}


def tiny_model():
    return wide_and_deep.build_model(recipe.make_config("wide_and_deep", TINY))


def test_embedding_gradients_are_indexed_slices_with_one_row_per_lookup():
    model = tiny_model()
    features, labels = wide_and_deep.synthetic_click_log(8, seed=0)
    with tf.GradientTape() as tape:
        loss = wide_and_deep.RECIPE.loss(labels, model(features, training=True))
    grads = dict(zip((v.path for v in model.trainable_variables),
                     tape.gradient(loss, model.trainable_variables)))
    deep, wide = grads.pop("deep_embedding/embeddings"), grads.pop("wide_weights/embeddings")
    assert isinstance(deep, tf.IndexedSlices) and isinstance(wide, tf.IndexedSlices)
    assert deep.values.shape == (8 * 26, 4) and wide.values.shape == (8 * (26 + 2), 1)
    assert tuple(deep.dense_shape.numpy()) == (2000, 4)
    # Everything else (MLP, normalization) has ordinary dense gradients.
    assert grads and all(isinstance(g, tf.Tensor) for g in grads.values())


def test_hashing_puts_each_feature_and_cross_in_its_own_rows_deterministically():
    rng = np.random.default_rng(1)
    ids = rng.integers(-1, 2**32, (500, 26))
    layer = wide_and_deep.HashedFeatures(2000, crosses=[(0, 1), (4, 5)])
    rows = layer(ids).numpy()
    per_column = 2000 // 28
    assert rows.shape == (500, 28)
    for column in range(28):
        assert ((rows[:, column] >= column * per_column)
                & (rows[:, column] < (column + 1) * per_column)).all()
    # Deterministic: a new layer (e.g. the reloaded model's) gives the same rows.
    again = wide_and_deep.HashedFeatures(2000, crosses=[(0, 1), (4, 5)])
    np.testing.assert_array_equal(again(ids).numpy(), rows)
    # The same ids in two features land on unrelated rows of their ranges.
    same = np.repeat(ids[:, :1], 26, axis=1)
    relative = layer(same).numpy()[:, :26] % per_column
    assert np.mean(relative[:, 0] == relative[:, 1]) < 0.05
    # Ids spread over a feature's range.
    assert len(np.unique(rows[:, 3])) > 0.8 * per_column


@pytest.mark.parametrize("options, settings, message", [
    ({"crosses": "0x26"}, {}, "--option=crosses=0x26: expected pairs of feature indices"),
    ({"hidden_units": "64,,32"}, {}, "--option=hidden_units=64,,32: expected positive"),
    ({"table_rows": 28}, {}, "--option=table_rows=28 must be at least one row per feature and "
                             "cross (29)"),
    # What sharded tables cannot follow, refused with the settings (so by --dry_run).
    ({"embeddings": "sharded"}, {"jit_compile": True}, "exchange rows inside the forward pass, "
                                                       "which XLA cannot hold"),
    ({"embeddings": "sharded"}, {"optimizer": "rmsprop"}, "RMSprop has no sparse update"),
    ({"embeddings": "sharded"}, {"ema_momentum": 0.99}, "moving average is not kept"),
    ({"embeddings": "sharded"}, {"optimizer": "sgd"}, "sgd with momentum has no sparse update"),
    ({"embeddings": "sharded"}, {"precision": "mixed_float16"}, "loss scaling is not supported"),
])
def test_bad_options_and_settings_are_refused_with_the_settings(options, settings, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        recipe.make_config("wide_and_deep", options, **settings)
    # The same settings with replicated tables are fine, as are sharded ones without them.
    if options.get("embeddings") == "sharded":
        recipe.make_config("wide_and_deep", **settings)
        recipe.make_config("wide_and_deep", options)


def test_synthetic_click_log_is_deterministic_heavy_tailed_and_learnable():
    features, labels = wide_and_deep.synthetic_click_log(20_000, seed=3)
    again, labels_again = wide_and_deep.synthetic_click_log(20_000, seed=3)
    other, other_labels = wide_and_deep.synthetic_click_log(20_000, seed=4)
    for name in ("dense", "categorical"):
        np.testing.assert_array_equal(features[name], again[name])
        assert not np.array_equal(features[name], other[name])
    np.testing.assert_array_equal(labels, labels_again)
    assert features["categorical"].shape == (20_000, 26) and labels.shape == (20_000, 1)
    assert 0.15 < labels.mean() < 0.4
    # Heavy tail: in a feature of a million ids the commonest few are a large share.
    _, counts = np.unique(features["categorical"][:, 20], return_counts=True)
    assert np.sort(counts)[-10:].sum() > 0.1 * 20_000 and len(counts) > 2_000
    # Planted signal: the click rate differs between feature 0's common ids.
    ids, first = np.unique(features["categorical"][:, 0], return_inverse=True)
    rates = [labels[first == i].mean() for i in np.argsort(-np.bincount(first))[:10]]
    assert max(rates) - min(rates) > 0.15


def test_synthetic_splits_hold_the_whole_log_once():
    hvdtrain.init()
    config = recipe.make_config("wide_and_deep", {"synthetic_examples": 1000}, batch_size=100)
    splits = wide_and_deep.load_data(config)
    assert (splits.train.steps, splits.train.examples) == (10, 1000)
    assert splits.validation.examples == 100
    features, labels = next(iter(splits.train.batches(0)))
    assert features["dense"].dtype == tf.float32 and features["categorical"].dtype == tf.int64
    assert labels.shape == (100, 1)


def write_records(path, records):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
                       for key, values in record.items()}
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())


GOOD = {"label": [1], "dense": list(range(13)), "categorical": list(range(26))}


@pytest.mark.parametrize("bad, message", [
    ({"label": [0], "dense": list(range(13))}, "categorical"),
    ({**GOOD, "dense": list(range(12))}, "dense"),
    ({**GOOD, "label": [2]}, "a label is not 0 or 1"),
])
def test_records_off_the_schema_are_named_by_file(tmp_path, bad, message):
    hvdtrain.init()
    good, broken = tmp_path / "train-0.tfrecord", tmp_path / "train-1.tfrecord"
    write_records(good, [GOOD] * 3)
    write_records(broken, [GOOD] * 5000 + [bad])  # past the first checked batch
    wide_and_deep.check_records([str(good)])
    with pytest.raises(UsageError, match=message) as error:
        wide_and_deep.check_records([str(good), str(broken)])
    assert str(broken) in str(error.value) and "\n" not in str(error.value)
    assert "node" not in str(error.value) and "{{" not in str(error.value)


def test_a_truncated_file_is_called_truncated_not_off_the_schema(tmp_path):
    hvdtrain.init()
    cut = tmp_path / "train-0.tfrecord"
    write_records(cut, [GOOD] * 3)
    cut.write_bytes(cut.read_bytes()[:-5])
    with pytest.raises(UsageError) as error:
        wide_and_deep.check_records([str(cut)])
    assert str(error.value) == (f"TFRecord file {cut} is truncated (it ends inside the record "
                                "at byte 218); replace it with a complete copy or remove it")


def test_model_reloads_with_its_hashing(tmp_path):
    import keras

    model = tiny_model()
    features, _ = wide_and_deep.synthetic_click_log(16, seed=0)
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(model(features).numpy(), reloaded(features).numpy())
