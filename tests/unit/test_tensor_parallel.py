"""Tensor parallelism in one process (T=1, where the layers are the Keras
layers they export to): the layout's groups, the layers' outputs,
serialization and export, the split of whole weights, the settings a split
replica cannot follow, and the model-FLOPs line. Their collectives are
tested at np=2 and np=4 in tests/ranked/test_tensor_parallel.py."""

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.layers import (
    ColumnParallelDense,
    ParallelMultiHeadAttention,
    RowParallelDense,
    VocabParallelEmbedding,
    VocabParallelSparseCategoricalCrossentropy,
    replicated_copy,
    set_whole_weights,
)
from hvdtrain.layout import Layout
from hvdtrain.parallel import split_variables
from hvdtrain.tools import flops


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def test_replicas_are_consecutive_ranks_and_groups_cover_each_rank_once():
    arranged = Layout(8, 2)
    assert arranged.replicas == 4
    assert arranged.tensor_group(5) == [4, 5]
    assert arranged.data_group(5) == [1, 3, 5, 7]
    assert arranged.groups() == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 2, 4, 6], [1, 3, 5, 7]]
    # A group of one rank or of all needs no process set of its own.
    assert Layout(4, 4).groups() == [] and Layout(4, 1).groups() == []


def test_a_split_weight_is_its_part_of_the_whole_and_back():
    split = split_variables.TensorSplit(axis=1, parts=2)
    whole = np.arange(24).reshape(2, 6, 2)
    parts = [split.part(whole, rank, 4) for rank in range(4)]
    np.testing.assert_array_equal(parts[0], whole[:, :3])
    np.testing.assert_array_equal(parts[3], whole[:, 3:])   # rank 3: the second part
    assert split.whole_shape(parts[0].shape) == whole.shape
    assert list(split.holders(4)) == [0, 1]
    rebuilt = np.zeros_like(whole)
    for rank in split.holders(4):
        split.place(rebuilt, parts[rank], rank, 4)
    np.testing.assert_array_equal(rebuilt, whole)


def gpt_like():
    ids = keras.Input((5,), dtype="int32")
    embedding = VocabParallelEmbedding(12, 8, name="tokens")
    x = embedding(ids)
    x = x + ParallelMultiHeadAttention(2, 4, name="attention")(x, x, use_causal_mask=True)
    h = ColumnParallelDense(16, activation="gelu", name="up")(x)
    x = x + RowParallelDense(8, name="down")(h)
    return keras.Model(ids, embedding(x, reverse=True))


def test_at_one_rank_the_layers_compute_what_their_keras_layers_do():
    model = gpt_like()
    copy = replicated_copy(model)
    kinds = {layer.name: type(layer) for layer in copy.layers}
    assert kinds["tokens"] is keras.layers.ReversibleEmbedding
    assert kinds["attention"] is keras.layers.MultiHeadAttention
    assert kinds["up"] is keras.layers.Dense and kinds["down"] is keras.layers.Dense
    ids = np.random.default_rng(0).integers(0, 12, (3, 5))
    np.testing.assert_allclose(model.predict(ids, verbose=0), copy.predict(ids, verbose=0),
                               rtol=0, atol=1e-5)
    # Whole weights of the Keras model set on the split one: the same model.
    other = gpt_like()
    set_whole_weights(other, copy.get_weights())
    np.testing.assert_allclose(other.predict(ids, verbose=0), copy.predict(ids, verbose=0),
                               rtol=0, atol=1e-5)


def test_the_layers_and_the_loss_round_trip_through_a_keras_file(tmp_path):
    model = gpt_like()
    model.compile("sgd", VocabParallelSparseCategoricalCrossentropy())
    model.save(tmp_path / "split.keras")
    loaded = keras.saving.load_model(tmp_path / "split.keras")
    ids = np.arange(10).reshape(2, 5)
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))
    assert isinstance(loaded.loss, VocabParallelSparseCategoricalCrossentropy)


def test_the_loss_at_one_rank_is_kerass():
    rng = np.random.default_rng(1)
    logits, targets = rng.normal(size=(4, 3, 12)) * 3, rng.integers(0, 12, (4, 3))
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(targets, logits)
    found = VocabParallelSparseCategoricalCrossentropy()(targets, logits)
    np.testing.assert_allclose(float(found), float(expected), rtol=1e-6)


def test_an_id_outside_the_vocabulary_is_refused():
    embedding = VocabParallelEmbedding(12, 4, name="tokens")
    with pytest.raises(Exception, match=r"embedding 'tokens' got id 12, outside \[0, 12\)"):
        embedding(np.array([[3, 12]]))


@pytest.mark.parametrize("changes, message", [
    ({"optimizer": "lamb"}, "--optimizer=lamb updates each weight as a whole"),
    ({"optimizer": "adafactor"}, "--optimizer=adafactor updates each weight as a whole"),
    ({"global_clipnorm": 1.0}, "clipping by norm needs the norm of whole gradients"),
    ({"clipnorm": 1.0}, "clipping by norm needs the norm of whole gradients"),
    ({"precision": "mixed_float16"}, "use --precision=mixed_bfloat16"),
    ({"jit_compile": True}, "tensor-parallel layers exchange activations inside the forward"),
])
def test_settings_a_split_replica_cannot_follow_are_refused(changes, message):
    TrainConfig(**changes).validate()   # fine without tensor parallelism
    with pytest.raises(UsageError, match=f"--tensor_parallel=2: .*{message}"):
        TrainConfig(tensor_parallel=2, **changes).validate()


def test_elementwise_knobs_go_with_tensor_parallelism():
    TrainConfig(tensor_parallel=2, optimizer="adamw", clipvalue=1.0, ema_momentum=0.99,
                precision="mixed_bfloat16", weight_decay=0.1).validate()


def test_model_flops_are_six_per_parameter_and_token_against_the_peak_known():
    line = flops.describe(1000.0, 2_000_000, 2, "NVIDIA A100-SXM4-80GB", "mixed_bfloat16")
    # 6 x 2e6 x 1000 = 1.2e10 FLOP/s in all, 6e9 per worker, of 312 TFLOP/s.
    assert "= 0.012 TFLOP/s, 0.006 per worker; MFU 0.0% of NVIDIA A100" in line
    assert flops.peak_teraflops("NVIDIA A100-SXM4-80GB", "float32") == 156.0
    assert flops.peak_teraflops("NVIDIA H100 PCIe", "mixed_float16") == 756.0
    assert flops.peak_teraflops("NVIDIA A10", "mixed_float16") == 125.0
    assert flops.peak_teraflops("CPU", "float32") is None
    assert "no peak known for CPU" in flops.describe(1.0, 1, 1, "CPU", "float32")
