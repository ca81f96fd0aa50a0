"""Tensor parallelism (hvdtrain.parallel.tensor_parallel) against the unsplit model
in one process:

- each layer (an MLP of a column- then a row-parallel dense layer, with a
  whole input split or a gathered output; attention, self and cross; the
  vocabulary-parallel embedding, tied and untied, with its loss) and a
  two-block GPT, started from the unsplit model's weights and trained for 5
  steps, equals the unsplit model trained on the global batch, to float32
  round-off: at np=2 with T=2 (one replica), and at np=4 with D=2 x T=2
  (and the layers at T=4); 4 workers at T=2 train as 2 without it;
- the vocabulary-parallel loss equals Keras's sparse categorical
  cross-entropy on the gathered logits, values and gradients, in float32
  and bfloat16;
- the gpt recipe learns at T=1 and T=2, exports plain Keras layers that
  predict what the split model predicts, resumes exactly, and reshards a
  checkpoint to another layout;
- bad layouts and settings end every rank with one line.

All cases run in the suite's shared launches (np=2 under both controllers,
np=4 under Gloo); each arranges its groups in-process (hvdtrain.layout).
"""

import json
import re

import horovod.tensorflow as hvd
import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import layout
from hvdtrain.layers import (
    ColumnParallelDense,
    ParallelMultiHeadAttention,
    RowParallelDense,
    VocabParallelEmbedding,
    VocabParallelSparseCategoricalCrossentropy,
    set_whole_weights,
)
from hvdtrain.parallel import split_variables
from hvdtrain.parallel.data_parallel.optimizer import DistributedOptimizer
from hvdtrain.parallel.tensor_parallel import operators
from launch import horovodrun, hvdtrain_command
from ranked.support import (
    gathered,
    merged,
    on_rank_0,
    refused_on_every_rank,
    replica_rows,
    stopped_in_the_second_epoch,
)

SEQUENCE, WIDTH, VOCABULARY, BATCH, STEPS = 6, 8, 16, 4, 5


def mlp(split, gather):
    """Column then row dense layers; `gather`: the column layer gathers its
    output and the row layer takes its slice of the whole again."""
    x = keras.Input((SEQUENCE, WIDTH))
    if not split:
        h = keras.layers.Dense(16, activation="gelu", name="up")(x)
        return keras.Model(x, keras.layers.Dense(WIDTH, name="down")(h))
    h = ColumnParallelDense(16, activation="gelu", gather_output=gather, name="up")(x)
    return keras.Model(x, RowParallelDense(WIDTH, input_is_parallel=not gather, name="down")(h))


def attention(split, cross):
    query = keras.Input((SEQUENCE, WIDTH))
    memory = keras.Input((SEQUENCE + 2, WIDTH - 2)) if cross else query
    kind = ParallelMultiHeadAttention if split else keras.layers.MultiHeadAttention
    out = kind(4, 3, name="attention")(query, memory, use_causal_mask=not cross)
    return keras.Model([query, memory] if cross else query, out)


def language_model(split, tie):
    ids = keras.Input((SEQUENCE,), dtype="int32")
    kind = VocabParallelEmbedding if split else keras.layers.ReversibleEmbedding
    embedding = kind(VOCABULARY, WIDTH, tie_weights=tie, name="tokens")
    x = keras.layers.Dense(WIDTH, activation="tanh", name="mix")(embedding(ids))
    return keras.Model(ids, embedding(x, reverse=True))


def inputs_of(case, rng, examples):
    if case.startswith("embedding"):
        return (rng.integers(0, VOCABULARY, (examples, SEQUENCE)).astype("int32"),
                rng.integers(0, VOCABULARY, (examples, SEQUENCE)).astype("int32"))
    x = rng.normal(size=(examples, SEQUENCE, WIDTH)).astype("float32")
    if case == "cross attention":
        x = (x, rng.normal(size=(examples, SEQUENCE + 2, WIDTH - 2)).astype("float32"))
    return x, rng.normal(size=(examples, SEQUENCE, WIDTH)).astype("float32")


MODELS = {
    "mlp": lambda split: mlp(split, gather=False),
    "mlp, gathered output": lambda split: mlp(split, gather=True),
    "self attention": lambda split: attention(split, cross=False),
    "cross attention": lambda split: attention(split, cross=True),
    "embedding, tied head": lambda split: language_model(split, tie=True),
    "embedding, own head": lambda split: language_model(split, tie=False),
}


def losses(case):
    if case.startswith("embedding"):
        return (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                VocabParallelSparseCategoricalCrossentropy())
    return "mse", "mse"


def rows(data, index):
    return tuple(a[index] for a in data) if isinstance(data, tuple) else data[index]


def train_both(build, data, labels, loss, split_loss, tensor_parallel, optimizer):
    """(the unsplit model, the split one), each trained for STEPS steps of
    the global batch from the same weights; the split one at T =
    `tensor_parallel` over the data-parallel replicas this launch has."""
    global_batch = BATCH * hvd.size() // tensor_parallel
    layout.arrange(1)
    keras.utils.set_random_seed(3)
    whole = build(False)
    start = whole.get_weights()
    whole.compile(optimizer(), loss)
    whole.fit(data, labels, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)

    layout.arrange(tensor_parallel)
    split = build(True)
    set_whole_weights(split, start)
    split.compile(DistributedOptimizer(optimizer(), process_set=layout.data_set()), split_loss)
    mine = replica_rows(global_batch, STEPS)
    split.fit(rows(data, mine), labels[mine], batch_size=BATCH, epochs=1, shuffle=False,
              verbose=0)
    return whole, split, start


def assert_parts_equal(whole, split, start, tolerance, moved_past=1000):
    moved = 0.0
    for reference, part, initial in zip(whole.weights, split.weights, start):
        placement = split_variables.placement_of(part)
        expected = reference.numpy()
        if placement is not None:
            expected = placement.part(expected, hvd.rank(), hvd.size())
        np.testing.assert_allclose(part.numpy(), expected, rtol=0, atol=tolerance,
                                   err_msg=part.path)
        moved = max(moved, float(np.abs(reference.numpy() - initial).max()))
    # Training moved the weights well past the tolerance: they agree because
    # both trained alike, not because neither moved.
    assert moved > moved_past * tolerance


SGD = lambda: keras.optimizers.SGD(0.1, momentum=0.9)  # noqa: E731
ADAM = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
LAYOUTS = [pytest.param(2, id="np2-T2")]
WIDER = [pytest.param(2, id="np4-D2xT2"), pytest.param(4, id="np4-T4")]


def check_layer(case, tensor_parallel, optimizer=SGD, tolerance=2e-6):
    rng = np.random.default_rng(11)
    examples = BATCH * hvd.size() // tensor_parallel * STEPS
    data, labels = inputs_of(case, rng, examples)
    loss, split_loss = losses(case)
    whole, split, start = train_both(MODELS[case], data, labels, loss, split_loss,
                                     tensor_parallel, optimizer)
    assert_parts_equal(whole, split, start, tolerance)
    return whole, split


@pytest.mark.parametrize("tensor_parallel", LAYOUTS)
@pytest.mark.parametrize("case", MODELS)
def test_each_layer_trains_as_the_unsplit_one(case, tensor_parallel):
    check_layer(case, tensor_parallel)


@pytest.mark.launches(np=4)
@pytest.mark.parametrize("tensor_parallel", WIDER)
@pytest.mark.parametrize("case", ["mlp", "self attention", "embedding, own head"])
def test_each_layer_trains_as_the_unsplit_one_over_replicas(case, tensor_parallel):
    check_layer(case, tensor_parallel)


@pytest.mark.launches(controllers=("gloo",))
def test_adam_slots_of_the_parts_follow_the_unsplit_update():
    whole, split = check_layer("mlp", 2, optimizer=ADAM, tolerance=2e-5)
    slots = [v for v in split.optimizer.variables if split_variables.is_sharded(v)]
    # Adam's two moments of each split weight are split like it (checkpoints gather them).
    assert len(slots) == 2 * sum(split_variables.is_sharded(w) for w in split.trainable_weights)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_vocabulary_parallel_loss_is_kerass_on_the_gathered_logits(precision):
    layout.arrange(2)
    rng = np.random.default_rng(5)
    logits = tf.constant(rng.normal(size=(3, 5, VOCABULARY)) * 4, tf.float32)
    targets = tf.constant(rng.integers(0, VOCABULARY, (3, 5)), tf.int32)
    width = VOCABULARY // 2
    mine = logits[..., layout.tensor_rank() * width:(layout.tensor_rank() + 1) * width]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([logits, mine])
        part = tf.cast(mine, precision)
        split = VocabParallelSparseCategoricalCrossentropy()(targets, part)
        full = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            targets, tf.cast(tf.cast(logits, precision), tf.float32))
    tolerance = 1e-6 if precision == "float32" else 1e-2
    np.testing.assert_allclose(split.numpy(), full.numpy(), rtol=tolerance)
    expected = tape.gradient(full, logits).numpy()[
        ..., layout.tensor_rank() * width:(layout.tensor_rank() + 1) * width]
    np.testing.assert_allclose(tape.gradient(split, mine).numpy(), expected, rtol=0,
                               atol=tolerance / 10)


def test_gather_and_split_are_each_others_transpose():
    layout.arrange(2)
    x = tf.constant(np.arange(12, dtype="float32").reshape(3, 4) + 10 * hvd.rank())
    with tf.GradientTape() as tape:
        tape.watch(x)
        gathered_x = operators.gather_from_group(x, "test.gather")
        weights = tf.range(8, dtype=tf.float32)
        loss = tf.reduce_sum(gathered_x * weights)
    np.testing.assert_array_equal(
        gathered_x.numpy(), np.concatenate([np.arange(12).reshape(3, 4) + 10 * r
                                            for r in range(2)], axis=-1))
    # The gradient of this rank's part is its slice of the whole's: the loss
    # is the same on both ranks, so it is not summed again.
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(),
                                  np.tile(np.arange(4) + 4 * hvd.rank(), (3, 1)))


GPT_OPTIONS = {"layers": 2, "d_model": 16, "heads": 4, "mlp_dim": 32, "vocab_size": 32,
               "sequence_length": 8}


def gpt(tensor_parallel):
    from hvdtrain import recipe

    config = recipe.make_config("gpt", options=GPT_OPTIONS, tensor_parallel=tensor_parallel)
    from hvdtrain.recipes import gpt as gpt_recipe

    return gpt_recipe.build_model(config)


def check_gpt(tensor_parallel, tolerance=2e-6, moved_past=1000):
    from hvdtrain.recipes import gpt as gpt_recipe

    examples = BATCH * hvd.size() // tensor_parallel * STEPS
    train, _, _ = gpt_recipe.synthetic_corpus(32, 4, 8, examples, 4, 0)
    whole, split, start = train_both(
        lambda is_split: gpt(tensor_parallel if is_split else 1),
        train[:, :-1], train[:, 1:], gpt_recipe.RECIPE.loss, gpt_recipe.RECIPE.loss,
        tensor_parallel, SGD)
    assert_parts_equal(whole, split, start, tolerance, moved_past)


@pytest.mark.parametrize("tensor_parallel", LAYOUTS)
def test_a_two_block_gpt_trains_as_the_unsplit_one(tensor_parallel):
    check_gpt(tensor_parallel)


@pytest.mark.launches(np=4)
def test_a_two_block_gpt_trains_as_the_unsplit_one_over_replicas():
    check_gpt(2)   # D=2 x T=2 (T=4: the layers' cases above)


@pytest.mark.launches(controllers=("gloo",))
def test_a_gpt_computing_in_bfloat16_trains_as_the_unsplit_one():
    # Horovod carries no bfloat16: the split layers reduce in float32 and
    # gather 16-bit patterns; the two models differ by bfloat16's round-off.
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    check_gpt(2, tolerance=5e-3, moved_past=10)


@pytest.mark.launches(np=4)
def test_dropout_draws_a_stream_per_tensor_parallel_rank_inside_the_split_region():
    from hvdtrain.parallel import collectives

    layout.arrange(2)
    keras.utils.set_random_seed(1)
    query = keras.Input((6, 8))
    inside = ParallelMultiHeadAttention(2, 4, dropout=0.5, name="attention")
    outside = keras.layers.Dropout(0.5, name="residual_dropout")
    model = keras.Model(query, outside(inside(query, query)))
    collectives.broadcast_variables(model.variables)   # as training starts
    kept = gathered((inside._drop(tf.ones((2, 2, 6, 6))).numpy() > 0,
                     outside(tf.ones((2, 6, 8)), training=True).numpy() > 0))
    # Ranks 0 and 2 are tensor-parallel rank 0 of replicas 0 and 1, 1 and 3 rank 1.
    assert not np.array_equal(kept[0][0], kept[1][0])
    np.testing.assert_array_equal(kept[0][0], kept[2][0])
    np.testing.assert_array_equal(kept[1][0], kept[3][0])
    for rank in range(1, 4):   # outside: the same stream everywhere
        np.testing.assert_array_equal(kept[0][1], kept[rank][1])


# The recipe's command-line runs: the README's command, one thread per rank,
# reproducible input order.
SMALL = ["--recipe=gpt", "--intra_op_threads=1", "--deterministic"]


# Resuming and resharding need no learning: a smaller model, shorter epochs.
QUICK = ["--option=train_sequences=1024", "--option=validation_sequences=128",
         "--option=layers=1", "--option=d_model=32", "--option=mlp_dim=64"]


def train(capfd, model_dir, *args):
    result = merged(hvdtrain_command(capfd, "train", f"--model_dir={model_dir}", *SMALL, *args))
    assert result.status == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def validation_loss(result):
    return float(re.findall(r"val_loss: ([\d.]+)", result.stdout)[-1])


def reported(result, name):
    return float(re.search(rf"{name} ([\d.]+)", result.stderr).group(1))


def exported(model_dir):
    return keras.saving.load_model(model_dir / "model.keras", compile=False)


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_the_recipe_learns_and_exports_plain_keras(shared_tmp_path, capfd, tensor_parallel):
    # Several steps per call: the split layers' collectives in a compiled loop.
    result = train(capfd, shared_tmp_path, f"--tensor_parallel={tensor_parallel}",
                   "--steps_per_execution=4")
    unigram = reported(result, "unigram baseline")
    achievable = reported(result, "achievable")
    assert validation_loss(result) < achievable + 0.3 * (unigram - achievable), result.stdout
    assert re.search(r"tokens/s; model FLOPs 6 x [\d,]+ parameters", result.stderr)

    # hvdtrain evaluate builds the split model and gives each rank its parts
    # of the exported weights: the validation loss training reported.
    evaluated = merged(hvdtrain_command(capfd, "evaluate", f"--model_dir={shared_tmp_path}",
                                        f"--tensor_parallel={tensor_parallel}"))
    assert evaluated.status == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    metrics = json.loads((shared_tmp_path / "evaluation-validation.json").read_text())["metrics"]
    assert metrics["loss"] == pytest.approx(validation_loss(result), abs=1e-3)

    model = exported(shared_tmp_path)
    assert {type(layer).__module__.split(".")[0] for layer in model.layers} == {"keras"}
    # The split model, given the exported weights, predicts the same logits.
    from hvdtrain.recipes import gpt as gpt_recipe

    from hvdtrain.recipe import make_config

    layout.arrange(tensor_parallel)
    split = gpt_recipe.build_model(make_config("gpt", tensor_parallel=tensor_parallel))
    set_whole_weights(split, model.get_weights())
    tokens = np.random.default_rng(0).integers(0, 128, (2, 64)).astype("int32")
    logits = operators.gather_from_group(split(tokens), "test.logits").numpy()
    np.testing.assert_allclose(logits, model.predict(tokens, verbose=0), rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_resumes_exactly_and_in_another_layout(shared_tmp_path, capfd):
    train(capfd, shared_tmp_path / "straight", *QUICK, "--tensor_parallel=2", "--epochs=2")
    train(capfd, shared_tmp_path / "resumed", *QUICK, "--tensor_parallel=2", "--epochs=1")
    train(capfd, shared_tmp_path / "resumed", *QUICK, "--tensor_parallel=2", "--epochs=2",
          "--resume")
    straight = exported(shared_tmp_path / "straight")
    for a, b in zip(straight.weights, exported(shared_tmp_path / "resumed").weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    # Written at T=2, read at T=1 (2 replicas) and back: nothing left to
    # train, so the export is the state as restored, part by part.
    for tensor_parallel in (1, 2):
        train(capfd, shared_tmp_path / "resumed", *QUICK, f"--tensor_parallel={tensor_parallel}",
              "--epochs=2", "--resume")
        for a, b in zip(straight.weights, exported(shared_tmp_path / "resumed").weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy(),
                                          err_msg=f"T={tensor_parallel}: {a.path}")

    # Preempted: a signal to rank 1 in the second epoch stops both ranks of
    # the replica at the same step, with a checkpoint that resumes exactly.
    from hvdtrain import recipe

    preempted = shared_tmp_path / "preempted"
    config = recipe.make_config(
        "gpt", options=[option.removeprefix("--option=") for option in QUICK],
        model_dir=str(preempted), tensor_parallel=2, epochs=2, intra_op_threads=1,
        deterministic=True)
    where = stopped_in_the_second_epoch(config)
    assert where[0] == where[1], where
    train(capfd, preempted, *QUICK, "--tensor_parallel=2", "--epochs=2", "--resume")
    for a, b in zip(straight.weights, exported(preempted).weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"preempted: {a.path}")


@pytest.mark.slow
@pytest.mark.launches(np=4)
def test_d2xt2_trains_as_2_workers_and_its_checkpoint_reshards_to_d4(shared_tmp_path, capfd):
    train(capfd, shared_tmp_path / "run", *QUICK, "--tensor_parallel=2", "--epochs=1")
    written = exported(shared_tmp_path / "run").get_weights()
    # 4 workers at T=2 are 2 replicas: the batch per replica, the learning
    # rate scaled by 2, step for step what 2 workers do without tensor parallelism.
    alone = shared_tmp_path / "two_workers"
    finished = on_rank_0(horovodrun, ["hvdtrain", "train", f"--model_dir={alone}", *SMALL,
                                      *QUICK, "--epochs=1"], np=2, timeout=300)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    for a, b in zip(written, exported(alone).get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    # Read at D=4 x T=1 (nothing left to train: the export is the state as
    # restored), trained on there, and read back at D=2 x T=2.
    train(capfd, shared_tmp_path / "run", *QUICK, "--tensor_parallel=1", "--epochs=1",
          "--resume")
    for a, b in zip(written, exported(shared_tmp_path / "run").get_weights()):
        np.testing.assert_array_equal(a, b, err_msg="at D=4 x T=1")
    result = train(capfd, shared_tmp_path / "run", *QUICK, "--tensor_parallel=1", "--epochs=2",
                   "--resume")
    assert "Epoch 2/2" in result.stdout and "Epoch 1/2" not in result.stdout
    on = exported(shared_tmp_path / "run").get_weights()
    train(capfd, shared_tmp_path / "run", *QUICK, "--tensor_parallel=2", "--epochs=2",
          "--resume")
    for a, b in zip(on, exported(shared_tmp_path / "run").get_weights()):
        np.testing.assert_array_equal(a, b, err_msg="back at D=2 x T=2")


BAD = {
    "workers not divisible": (["--tensor_parallel=4"], re.escape(
        "--tensor_parallel=4 does not divide the 2 workers into replicas")),
    "heads not divisible": (["--tensor_parallel=2", "--option=heads=3", "--option=d_model=66"],
                            re.escape("--option=heads=3 does not split over --tensor_parallel=2")),
    "an optimizer of whole weights": (["--tensor_parallel=2", "--optimizer=lamb"],
                                      "--optimizer=lamb updates each weight as a whole"),
}


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_ends_every_rank_with_one_line(shared_tmp_path, capfd, case):
    args, expected = BAD[case]
    line = refused_on_every_rank(gathered(hvdtrain_command(
        capfd, "train", *SMALL, *args, f"--model_dir={shared_tmp_path / 'run'}")))
    assert re.search(expected, line), line


@pytest.mark.launches(np=4)
def test_the_ranks_of_a_replica_read_the_same_batches_and_replicas_their_own():
    import hvdtrain

    layout.arrange(2)
    data = hvdtrain.data.from_arrays(np.arange(64).reshape(32, 2), batch_size=4, training=True)
    assert data.steps == 4   # 32 examples over 2 replicas of 4
    seen = gathered(np.concatenate([b.numpy() for b in data.batches(0)]))
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[2], seen[3])
    assert not set(seen[0][:, 0]) & set(seen[2][:, 0])   # each replica its own shard
    assert len(set(seen[0][:, 0]) | set(seen[2][:, 0])) == 32


@pytest.mark.launches(controllers=("gloo",))
def test_a_table_sharded_over_all_workers_is_refused_in_a_split_replica_or_pipeline():
    from hvdtrain.errors import UsageError
    from hvdtrain.layers import ShardedEmbedding

    for tensor_parallel, pipeline_parallel in ((2, 1), (1, 2)):
        layout.arrange(tensor_parallel, pipeline_parallel)
        with pytest.raises(UsageError, match="with --tensor_parallel or --pipeline_parallel, "
                                             "split the table with "
                                             "hvdtrain.layers.VocabParallelEmbedding"):
            ShardedEmbedding(64, 4, name="items").build((None, 2))
