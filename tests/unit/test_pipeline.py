"""Pipeline parallelism in one process: the schedules' order, the
activations they hold and their bubble; cutting Sequential and functional
models into stages, and the cuts refused; the layout's groups with
pipeline stages; a one-stage pipeline's micro-batches adding up to the
whole batch. The stages' passes between ranks are tested at np=2 and np=4
in tests/ranked/test_pipeline.py."""

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.layout import Layout
from hvdtrain.parallel import pipeline_parallel
from hvdtrain.parallel.pipeline_parallel import schedules


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def kinds(actions):
    return " ".join(f"{a.kind[0].upper()}{a.microbatch}" for a in actions)


def test_gpipe_runs_every_forward_then_every_backward():
    assert kinds(schedules.gpipe(2, 3, 0)) == "F0 F1 F2 B0 B1 B2"


def test_1f1b_warms_up_alternates_and_cools_down():
    assert kinds(schedules.one_forward_one_backward(4, 6, 0)) == (
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5")
    assert kinds(schedules.one_forward_one_backward(4, 6, 3)) == (
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5")
    # Fewer micro-batches than the warm-up: all forwards, then all backwards.
    assert kinds(schedules.one_forward_one_backward(4, 2, 0)) == "F0 F1 B0 B1"


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (4, 16), (3, 5)])
def test_1f1b_holds_at_most_the_pipelines_depth_and_gpipe_every_microbatch(stages,
                                                                             microbatches):
    for stage in range(stages):
        one_f_one_b = schedules.one_forward_one_backward(stages, microbatches, stage)
        assert schedules.peak_stashed(one_f_one_b) == min(stages - stage, microbatches)
        assert schedules.peak_stashed(schedules.gpipe(stages, microbatches, stage)) == (
            microbatches)
        # Each micro-batch once each way, its backward after its forward.
        for action_list in (one_f_one_b, schedules.gpipe(stages, microbatches, stage)):
            order = [(a.kind, a.microbatch) for a in action_list]
            assert sorted(order) == sorted((kind, i) for kind in ("forward", "backward")
                                           for i in range(microbatches))
            assert all(order.index(("forward", i)) < order.index(("backward", i))
                       for i in range(microbatches))


def test_the_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    assert schedules.bubble(4, 4) == pytest.approx(3 / 7)
    assert schedules.bubble(2, 8) == pytest.approx(1 / 9)
    assert schedules.bubble(1, 4) == 0


def test_fewer_microbatches_than_stages_are_told_the_bubble_they_cost():
    assert schedules.few_microbatches(4, 2) == (
        "2 micro-batches for 4 stages: each stage waits 60% of every step (the bubble; 16% at "
        "16 micro-batches)")
    assert schedules.few_microbatches(4, 4) is None


def test_a_pipeline_is_outermost_and_its_neighbours_have_process_sets():
    arranged = Layout(8, tensor=2, pipeline=2)
    assert arranged.replicas == 2
    assert arranged.position(5) == (1, 0, 1)      # tensor rank 1, replica 0, stage 1
    assert arranged.tensor_group(5) == [4, 5]
    assert arranged.data_group(5) == [5, 7]
    assert arranged.pipeline_group(5) == [1, 5]
    assert arranged.stage_group(5) == [4, 5, 6, 7]
    # The pairs: tensor-parallel, data-parallel, pipelines; then each stage's ranks.
    assert arranged.groups() == [[0, 1], [0, 2], [0, 4], [1, 3], [1, 5], [2, 3], [2, 6],
                                 [3, 7], [4, 5], [4, 6], [5, 7], [6, 7], [0, 1, 2, 3],
                                 [4, 5, 6, 7]]
    # Four stages: the pipeline's group and each pair of neighbours.
    deep = Layout(4, pipeline=4)
    assert deep.groups() == [[0, 1], [1, 2], [2, 3]]
    assert Layout(8, pipeline=4).groups()[-2:] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert Layout(8, pipeline=4).stage_group(3) == [2, 3]


def residual_model():
    x = keras.Input((6,), name="features")
    h = keras.layers.Dense(8, activation="tanh", name="embed")(x)
    inner = keras.layers.Dense(8, activation="tanh", name="inner")(h)
    h = keras.layers.Add(name="block")([h, inner])
    h = keras.layers.Dense(8, activation="tanh", name="mix")(h)
    return keras.Model(x, keras.layers.Dense(3, name="head")(h))


def _chained(stages, x):
    for stage in stages:
        x = stage(x)
    return x


def test_a_cut_takes_every_tensor_made_before_it_and_used_after_it():
    model = residual_model()
    assert [(layer.name, [t._keras_history.operation.name for t in crossing])
            for layer, crossing in pipeline_parallel.boundaries(model)] == [
        ("embed", ["embed"]), ("inner", ["embed", "inner"]), ("block", ["block"]),
        ("mix", ["mix"])]
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    stages = pipeline_parallel.cut(model, at=["block"])
    assert [[layer.name for layer in s.layers if layer.weights] for s in stages] == [
        ["embed", "inner"], ["mix", "head"]]
    np.testing.assert_allclose(_chained(stages, x), model(x), rtol=1e-6)
    # Inside the residual block, the skip connection crosses too.
    inside = pipeline_parallel.cut(model, at=["inner"])
    assert len(inside[1].inputs) == 2
    np.testing.assert_allclose(_chained(inside, x), model(x), rtol=1e-6)


def test_a_tensor_needed_stages_later_passes_through_the_stages_between():
    tokens = keras.Input((5,), dtype="int32", name="tokens")
    mask = keras.ops.cast(keras.ops.not_equal(tokens, 0), "float32")   # from the inputs
    h = keras.layers.Embedding(10, 4, name="embed")(tokens)
    h = keras.layers.Dense(4, name="first")(keras.layers.Flatten()(h))
    h = keras.layers.Dense(5, name="second")(h)
    model = keras.Model(tokens, keras.layers.Dense(2, name="head")(h * mask))
    stages = pipeline_parallel.cut(model, at=["first", "second"])
    assert [len(s.inputs) for s in stages] == [1, 2, 2]
    ids = np.array([[1, 2, 0, 0, 0], [3, 4, 5, 6, 7]], "int32")
    np.testing.assert_allclose(_chained(stages, ids), model(ids), rtol=1e-6)


def test_a_sequential_model_cuts_at_indices_or_names():
    model = keras.Sequential([keras.Input((4,)), *[keras.layers.Dense(4, name=f"d{i}")
                                                   for i in range(4)]])
    by_index = pipeline_parallel.cut(model, at=[1, 3])
    by_name = pipeline_parallel.cut(model, at=["d0", "d2"])
    for stages in (by_index, by_name):
        assert [[layer.name for layer in s.layers if layer.weights] for s in stages] == [
            ["d0"], ["d1", "d2"], ["d3"]]


def test_stages_of_about_equal_parameters_when_no_cut_points_are_given():
    x = keras.Input((8,))
    h = x
    for i, width in enumerate([8, 8, 64, 8, 8]):
        h = keras.layers.Dense(width, name=f"d{i}")(h)
    stages = pipeline_parallel.cut(keras.Model(x, h), stages=2)
    # 72 + 72 + 576 | 520 + 72 parameters: the cut nearest half of 1312.
    assert [layer.name for layer in stages[0].layers if layer.weights] == ["d0", "d1", "d2"]


@pytest.mark.parametrize("at,message", [
    (["nowhere"], "'nowhere' is not a layer of model"),
    (["mix", "block"], "not in the model's order"),
    (["block", "block"], "repeat one"),
    (["head"], "'head' leaves the last stage empty: cut after one of embed, inner, block, mix"),
])
def test_cut_points_that_do_not_cut_the_model_are_refused(at, message):
    with pytest.raises(UsageError, match=message):
        pipeline_parallel.cut(residual_model(), at=at)


def test_a_layer_with_state_of_its_own_is_not_split_between_stages():
    x = keras.Input((4,))
    shared = keras.layers.BatchNormalization(name="shared_norm")
    h = keras.layers.Dense(4, name="before")(shared(x))
    h = keras.layers.Dense(4, name="between")(h)
    model = keras.Model(x, keras.layers.Dense(2, name="head")(shared(h)))
    with pytest.raises(UsageError, match=(
            "cannot be cut after layer 'before': layer 'shared_norm' runs on both sides of it "
            "and keeps state of its own .*moving_mean.*; cut where its calls stay in one "
            r"stage: after one of no layer \(by name\)")):
        pipeline_parallel.cut(model, at=["before"])


def test_a_sparse_tensor_does_not_cross_a_cut():
    x = keras.Input((6,), sparse=True, name="counts")
    h = keras.layers.Dense(4, name="first")(x)
    both = keras.layers.Concatenate()([h, keras.layers.Dense(4, name="again")(x)])
    model = keras.Model(x, keras.layers.Dense(2, name="head")(both))
    with pytest.raises(UsageError, match="a sparse tensor, would cross it"):
        pipeline_parallel.cut(model, at=["first"])


def test_a_tied_embedding_is_held_by_both_stages_it_runs_on():
    ids = keras.Input((5,), dtype="int32")
    embedding = keras.layers.ReversibleEmbedding(10, 4, name="tokens")
    h = keras.layers.Dense(4, name="mix")(embedding(ids))
    model = keras.Model(ids, embedding(h, reverse=True))
    first, second = pipeline_parallel.cut(model, at=["mix"])
    assert [v.path for v in first.weights] == ["tokens/embeddings", "mix/kernel", "mix/bias"]
    assert [v.path for v in second.weights] == ["tokens/embeddings"]
    assert first.weights[0] is second.weights[0]


def test_indices_out_of_range_and_subclassed_models_are_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(4)])
    with pytest.raises(UsageError, match="leaves a stage empty.*from 1 to 1"):
        pipeline_parallel.cut(model, at=[2])
    with pytest.raises(UsageError, match="indices cut Sequential models"):
        pipeline_parallel.cut(residual_model(), at=[1])

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(UsageError, match="not a Sequential or functional model"):
        pipeline_parallel.cut(Subclassed(), stages=2)


def test_a_pipeline_needs_one_stage_per_pipeline_rank_and_a_known_schedule():
    stages = pipeline_parallel.cut(residual_model(), at=["block"])
    with pytest.raises(UsageError, match="2 pipeline stages and the layout 1"):
        pipeline_parallel.Pipeline(stages, microbatches=2)
    with pytest.raises(UsageError, match="schedule 'zigzag' is not one of 1f1b, gpipe"):
        pipeline_parallel.Pipeline(stages[:1], microbatches=2, schedule="zigzag")
    with pytest.raises(UsageError, match="microbatches must be a positive integer"):
        pipeline_parallel.Pipeline(stages[:1], microbatches=0)


def test_one_stage_in_microbatches_trains_as_the_whole_batch():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 6)).astype("float32")
    y = rng.normal(size=(40, 3)).astype("float32")
    keras.utils.set_random_seed(2)
    whole = residual_model()
    start = whole.get_weights()
    whole.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse", metrics=["mae"])
    expected = whole.fit(x, y, batch_size=10, shuffle=False, verbose=0).history
    model = residual_model()
    model.set_weights(start)
    one_stage = pipeline_parallel.Pipeline([model], microbatches=3)   # 10 rows: 4, 3, 3
    one_stage.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse", metrics=["mae"])
    history = one_stage.fit(x, y, batch_size=10, shuffle=False, verbose=0).history
    for name, values in expected.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-5)
    for mine, reference in zip(model.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(mine, reference, rtol=0, atol=1e-6)


def test_xla_and_loss_scaling_are_refused_at_compile():
    one_stage = pipeline_parallel.Pipeline([residual_model()], microbatches=2)
    with pytest.raises(UsageError, match="cannot be compiled with XLA"):
        one_stage.compile("sgd", "mse", jit_compile=True)
    with pytest.raises(UsageError, match="loss-scale optimizer"):
        one_stage.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), "mse")


@pytest.mark.parametrize("changes, message", [
    ({"global_clipnorm": 1.0}, "--global_clipnorm needs the norm of every gradient"),
    ({"precision": "mixed_float16"}, "mixed_float16's loss scaling would let each stage"),
    ({"jit_compile": True}, "XLA cannot hold the passes between stages"),
    ({"batch_size": 12}, r"--batch_size=12 does not split into 8 micro-batches \(4 x P by "
                         r"default\)"),
    ({"microbatches": 5}, "--batch_size=32 does not split into 5 micro-batches;"),
    ({"pipeline_cuts": "a,b"}, r"--pipeline_cuts names 2 layer\(s\); 2 stages end at 1"),
])
def test_settings_a_pipeline_cannot_follow_are_refused(changes, message):
    with pytest.raises(UsageError, match=f"--pipeline_parallel=2: {message}"):
        TrainConfig(pipeline_parallel=2, **changes).validate()


@pytest.mark.parametrize("name, value", [("microbatches", 4), ("pipeline_schedule", "gpipe"),
                                         ("pipeline_cuts", "block")])
def test_pipeline_settings_without_a_pipeline_are_refused(name, value):
    with pytest.raises(UsageError, match=f"--{name} applies to a pipeline: set "
                                         "--pipeline_parallel"):
        TrainConfig(**{name: value}).validate()


def test_knobs_of_each_weight_go_with_a_pipeline():
    config = TrainConfig(pipeline_parallel=2, optimizer="lamb", clipnorm=1.0, ema_momentum=0.99,
                         precision="mixed_bfloat16", microbatches=2, pipeline_cuts=" block ")
    assert config.validate().pipeline_microbatches() == 2
    assert config.pipeline_cut_points() == ["block"]
