"""ShardedEmbedding in one process: a drop-in for keras.layers.Embedding,
lazy Adam's difference from Keras's dense Adam, the placements' rows, and
the settings the sparse rules and the lookups' collectives refuse."""

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain.errors import UsageError
from hvdtrain.layers import ShardedEmbedding, replicated_copy
from hvdtrain.parallel import split_variables


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def recommender(table):
    ids = keras.Input((2,), dtype="int32")
    return keras.Model(ids, keras.layers.Dense(1, name="dense")(
        keras.layers.Flatten()(table(ids))))


def trained(table, optimizer, batches):
    model = recommender(table)
    model.layers[1].embeddings.assign(np.arange(40, dtype="float32").reshape(10, 4) / 40)
    model.get_layer("dense").set_weights([np.linspace(-1, 1, 8, dtype="float32")[:, None],
                                          np.zeros(1, "float32")])
    model.compile(hvdtrain.DistributedOptimizer(optimizer), "mse")
    for ids in batches:
        model.train_on_batch(np.array(ids), np.ones((len(ids), 1)))
    return model.layers[1].embeddings.numpy()


def test_looks_up_as_keras_embedding_does():
    table = ShardedEmbedding(10, 4, mask_zero=True)
    model = recommender(table)
    ids = np.array([[0, 3], [9, 3]])
    np.testing.assert_array_equal(table(ids).numpy(), table.embeddings.numpy()[ids])
    assert table.compute_output_shape((None, 2)) == (None, 2, 4)
    np.testing.assert_array_equal(table.compute_mask(ids), ids != 0)
    assert model.output_shape == (None, 1)


def test_lazy_adam_leaves_rows_not_looked_up_where_keras_adam_moves_them():
    batches = [[[1, 2]], [[3, 4]]]   # rows 1 and 2 are not in the second batch
    lazy = trained(ShardedEmbedding(10, 4), keras.optimizers.Adam(0.1), batches[:1])
    lazy_after = trained(ShardedEmbedding(10, 4), keras.optimizers.Adam(0.1), batches)
    dense = trained(keras.layers.Embedding(10, 4), keras.optimizers.Adam(0.1), batches[:1])
    dense_after = trained(keras.layers.Embedding(10, 4), keras.optimizers.Adam(0.1), batches)
    # The first step is the same; then Keras's momentum keeps moving rows 1 and 2.
    np.testing.assert_allclose(lazy, dense, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(lazy_after[[1, 2]], lazy[[1, 2]])
    assert np.abs(dense_after[[1, 2]] - dense[[1, 2]]).min() > 1e-3
    np.testing.assert_allclose(lazy_after[[3, 4]], dense_after[[3, 4]], rtol=0, atol=1e-6)


def test_sgd_and_adagrad_touch_only_rows_looked_up_and_equal_keras():
    for optimizer in ("sgd", "adagrad"):
        batches = [[[1, 1], [2, 5]], [[3, 1]]]   # a row twice in a batch: summed
        sparse = trained(ShardedEmbedding(10, 4), keras.optimizers.get(optimizer), batches)
        dense = trained(keras.layers.Embedding(10, 4), keras.optimizers.get(optimizer), batches)
        np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-7, err_msg=optimizer)


def test_placements_own_every_row_once():
    for placement in (split_variables.Placement(10), split_variables.Placement(10, owner=3)):
        for size in (1, 2, 3, 4):
            owned = np.concatenate([placement.owned_rows(r, size) for r in range(size)])
            np.testing.assert_array_equal(np.sort(owned), np.arange(10))
            assert [placement.shard_rows(r, size) for r in range(size)] == [
                len(placement.owned_rows(r, size)) for r in range(size)]


def test_replicated_copy_holds_a_keras_embedding_with_the_table():
    model = recommender(ShardedEmbedding(10, 4, name="items"))
    copy = replicated_copy(model)
    assert type(copy.get_layer("items")) is keras.layers.Embedding
    np.testing.assert_array_equal(copy.get_layer("items").embeddings.numpy(),
                                  model.get_layer("items").embeddings.numpy())
    np.testing.assert_array_equal(copy.get_layer("dense").kernel.numpy(),
                                  model.get_layer("dense").kernel.numpy())


@pytest.mark.parametrize("optimizer, expected", [
    (keras.optimizers.RMSprop(), "RMSprop has no sparse update"),
    (keras.optimizers.SGD(momentum=0.9), "sgd with momentum"),
    (keras.optimizers.Adam(amsgrad=True), "amsgrad"),
    (keras.optimizers.Adam(clipnorm=1.0), "clipping by norm"),
    (keras.optimizers.Adam(use_ema=True), "moving average"),
])
def test_refuses_what_the_sparse_rules_cannot_follow(optimizer, expected):
    model = recommender(ShardedEmbedding(10, 4))
    model.compile(hvdtrain.DistributedOptimizer(optimizer), "mse")
    with pytest.raises(UsageError, match=expected):
        model.optimizer.build(model.trainable_variables)


def test_bad_placement_and_sizes_are_refused():
    with pytest.raises(UsageError, match="placement must be one of rows, table"):
        ShardedEmbedding(10, 4, placement="columns")
    with pytest.raises(UsageError, match="positive integers"):
        ShardedEmbedding(0, 4)


def test_xla_is_refused_for_the_lookups_collectives():
    model = recommender(ShardedEmbedding(10, 4))
    model.compile(hvdtrain.DistributedOptimizer(keras.optimizers.Adam()), "mse",
                  jit_compile=False)
    with pytest.raises(UsageError, match="exchange rows inside the forward pass"):
        hvdtrain.jit_compile(model)

