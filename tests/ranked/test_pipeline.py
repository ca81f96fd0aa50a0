"""Pipeline parallelism (hvdtrain.parallel.pipeline_parallel) against the whole model
in one process:

- a model cut into 2 stages and fed 4 micro-batches a step, trained for 5
  steps, equals the whole model trained on the global batch, to float32
  round-off, under both schedules: its weights, its logged loss and metric
  (joined by a stage's regularization), its exact evaluation of shards and
  its predictions; at
  np=2 (P=2) and at np=4 with D=2 x P=2 and with T=2 x P=2 (split layers
  inside each stage);
- activations and gradients in bfloat16 travel between stages losslessly;
- a model built deferred gets values on its own stage only, the whole
  model's;
- from the command line: the gpt recipe (its embedding tied across the
  first and last stages) pipelined at np=2 trains as one process and
  exports plain Keras (evaluating it at each composition, to the exit of
  every process: tests/parallel/test_compositions.py); preempted, every
  stage stops at one step and resumes bit-exactly; at np=4, T=2 x P=2 trains as one process and
  resumes at D=2 x P=2; bad input ends every rank with one line.

All cases run in the suite's shared launches (np=2 under both controllers,
np=4 under Gloo); each arranges its layout in-process (hvdtrain.layout).
"""

import json
import re

import horovod.tensorflow as hvd
import keras
import numpy as np
import pytest

from hvdtrain import callbacks, layout
from hvdtrain.layers import ColumnParallelDense, RowParallelDense, set_whole_weights
from hvdtrain.parallel import collectives, pipeline_parallel, split_variables
from hvdtrain.parallel.data_parallel.optimizer import DistributedOptimizer
from hvdtrain.parallel.pipeline_parallel import stage_weights
from hvdtrain.state import checkpoint
from launch import horovodrun, hvdtrain_command
from ranked.support import (
    computed_once,
    gathered,
    merged,
    refused_on_every_rank,
    replica_rows,
    stopped_in_the_second_epoch,
)

BATCH, STEPS, MICROBATCHES, WIDTH = 8, 5, 4, 6


def residual(split):
    """Dense layers around a residual block, an L2 penalty on the first
    stage; `split`: its MLPs column- then row-parallel."""
    x = keras.Input((WIDTH,))
    penalty = keras.regularizers.L2(1e-2)
    h = keras.layers.Dense(8, activation="tanh", name="embed", kernel_regularizer=penalty)(x)
    h = keras.layers.Add(name="block")([h, mlp(h, "", split)])
    return keras.Model(x, keras.layers.Dense(3, name="head")(mlp(h, "mix_", split)))


def mlp(x, prefix, split):
    up, down = ((ColumnParallelDense, RowParallelDense) if split
                else (keras.layers.Dense, keras.layers.Dense))
    return down(8, name=f"{prefix}down")(up(16, activation="tanh", name=f"{prefix}up")(x))


def train_both(schedule, tensor_parallel=1, precision=None):
    """(the whole model, the pipeline, the data, the whole's weights at the
    start) after STEPS steps of the global batch each."""
    replicas = hvd.size() // (2 * tensor_parallel)
    global_batch = BATCH * replicas
    rng = np.random.default_rng(7)
    x = rng.normal(size=(global_batch * STEPS, WIDTH)).astype("float32")
    y = rng.normal(size=(global_batch * STEPS, 3)).astype("float32")
    sgd = lambda: keras.optimizers.SGD(0.1, momentum=0.9)  # noqa: E731
    if precision:
        keras.mixed_precision.set_global_policy(precision)
    layout.arrange(1)
    keras.utils.set_random_seed(3)
    whole = residual(split=False)
    start = whole.get_weights()
    whole.compile(sgd(), "mse", metrics=["mae"])
    expected = whole.fit(x, y, batch_size=global_batch, shuffle=False, verbose=0).history

    layout.arrange(tensor_parallel, 2)
    model = residual(split=tensor_parallel > 1)
    set_whole_weights(model, start)
    pipelined = pipeline_parallel.Pipeline(pipeline_parallel.cut(model, at=["block"]),
                                           MICROBATCHES, schedule)
    pipelined.compile(DistributedOptimizer(sgd(), process_set=layout.data_set()), "mse",
                      metrics=["mae"])
    mine = replica_rows(global_batch, STEPS)
    history = pipelined.fit(x[mine], y[mine], batch_size=BATCH, shuffle=False,
                            verbose=0).history
    return whole, pipelined, (x, y, expected, history), start


def assert_stage_equals_its_layers(whole, pipelined, start, tolerance, moved_past=1000):
    reference = {w.path: (w.numpy(), initial) for w, initial in zip(whole.weights, start)}
    moved = 0.0
    for weight in pipelined.stage.weights:
        expected, initial = reference[weight.path]
        placement = split_variables.placement_of(weight)
        if placement is not None:
            expected = placement.part(expected, hvd.rank(), hvd.size())
            initial = placement.part(initial, hvd.rank(), hvd.size())
        np.testing.assert_allclose(weight.numpy(), expected, rtol=0, atol=tolerance,
                                   err_msg=weight.path)
        moved = max(moved, float(np.abs(expected - initial).max()))
    # Training moved the weights well past the tolerance.
    assert moved > moved_past * tolerance


def check(schedule, tensor_parallel=1):
    whole, pipelined, (x, y, expected, history), start = train_both(schedule,
                                                                    tensor_parallel)
    assert_stage_equals_its_layers(whole, pipelined, start, tolerance=2e-6)
    # Every stage logs its replica's loss (with the first stage's penalty) and
    # metric: averaged over the workers (as hvdtrain's AverageMetrics does),
    # the whole model's on the global batch.
    for name, values in expected.items():
        np.testing.assert_allclose(collectives.allreduce_scalars(history[name]), values,
                                   rtol=1e-5, err_msg=name)
    # Each replica evaluates its shard; the metric states summed over the
    # replicas (not the stages, which hold the same) are the whole split's.
    shard = replica_rows(16, 1)
    exact = callbacks.ExactEvaluation(steps=2)
    np.testing.assert_allclose(
        pipelined.evaluate(x[shard], y[shard], batch_size=16 // layout.data_size() // 2,
                           verbose=0, callbacks=[exact]),
        whole.evaluate(x[:16], y[:16], batch_size=8, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(pipelined.predict(x[:8], verbose=0),
                               whole.predict(x[:8], verbose=0), rtol=0, atol=1e-5)


SCHEDULES = ["1f1b", "gpipe"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_stages_train_as_the_whole_model_on_the_global_batch(schedule):
    check(schedule)


@pytest.mark.launches(np=4)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_two_stages_over_two_replicas_train_as_the_whole_model(schedule):
    check(schedule)   # D=2 x P=2


@pytest.mark.launches(np=4)
def test_two_stages_of_split_layers_train_as_the_whole_model():
    check("1f1b", tensor_parallel=2)   # T=2 x P=2


@pytest.mark.launches(controllers=("gloo",))
def test_bfloat16_activations_and_gradients_pass_between_stages():
    whole, pipelined, _, start = train_both("1f1b", precision="mixed_bfloat16")
    assert pipelined.stage.outputs[0].dtype == "bfloat16"
    # The two differ by bfloat16's round-off, which moves the weights too.
    assert_stage_equals_its_layers(whole, pipelined, start, tolerance=5e-3, moved_past=10)


# The gpt recipe from the command line: a small model, short epochs, one
# thread per rank, the input in order, a rate that does not depend on the
# epochs (a run's first epoch is the same in a run of two). Its embedding is
# tied to its head: the first and last stages both hold it.
GPT = ["--recipe=gpt", "--intra_op_threads=1", "--deterministic", "--warmup_epochs=0",
       "--lr_schedule=constant",
       "--option=train_sequences=256", "--option=validation_sequences=64",
       "--option=sequence_length=16", "--option=d_model=32", "--option=mlp_dim=64",
       "--batch_size=16"]
# Three steps per call of the train function: the stages' passes in one
# compiled loop train what one process trains a step at a time.
PIPELINED = ["--pipeline_parallel=2", "--microbatches=4", "--steps_per_execution=3"]


def train(capfd, model_dir, *args):
    result = merged(hvdtrain_command(capfd, "train", f"--model_dir={model_dir}", *GPT, *args))
    assert result.status == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def exported(model_dir):
    return keras.saving.load_model(model_dir / "model.keras", compile=False)


def assert_same_weights(a, b, atol=0.0, what=""):
    for x, y in zip(exported(a).weights, exported(b).weights):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=0, atol=atol,
                                   err_msg=f"{what} {x.path}")


def _train_alone(directory):
    finished = horovodrun(["hvdtrain", "train", f"--model_dir={directory}", *GPT, "--epochs=2"],
                          np=1, timeout=300)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]


@pytest.fixture(scope="module")
def alone():
    """The gpt recipe trained by one process, without a pipeline: its
    checkpoints after epochs 1 and 2 and its export (once per session)."""
    return computed_once("gpt-one-process", _train_alone)


def checkpointed(model_dir, name):
    """{variable name: value} of a checkpoint (the model's and the optimizer's)."""
    path = model_dir / "checkpoints" / name
    names = json.loads((path / checkpoint.META).read_text())["names"]
    return dict(zip(names, checkpoint.read(path)[1]))


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_the_recipe_pipelined_trains_as_one_process_and_resumes_exactly_when_preempted(
        shared_tmp_path, capfd, alone):
    straight = shared_tmp_path / "straight"
    result = train(capfd, straight, *PIPELINED, "--epochs=2")
    assert "2 workers = 1 data-parallel replicas x 1 tensor-parallel ranks x 2 pipeline " \
           "stages" in result.stderr
    # One model whose layers are Keras's own: the first stage's embedding
    # and the last stage's head, trained as one, and every block between.
    model = exported(straight)
    assert {type(layer).__module__.split(".")[0] for layer in model.layers} == {"keras"}
    assert_same_weights(straight, alone, atol=1e-5)

    # Rank 1, the last stage, is signalled in the second epoch: both stages
    # stop after the same step, and the checkpoint resumes bit for bit.
    from hvdtrain import recipe

    preempted = shared_tmp_path / "preempted"
    options = [a.removeprefix("--option=") for a in GPT if a.startswith("--option=")]
    config = recipe.make_config("gpt", options=options, model_dir=str(preempted), epochs=2,
                                intra_op_threads=1, deterministic=True, warmup_epochs=0,
                                lr_schedule="constant", batch_size=16, pipeline_parallel=2,
                                microbatches=4, steps_per_execution=3)
    where = stopped_in_the_second_epoch(config)
    assert where[0] == where[1], where
    train(capfd, preempted, *PIPELINED, "--epochs=2", "--resume")
    assert_same_weights(straight, preempted, what="preempted, resumed:")


BAD = {
    "stages that do not divide the workers": (
        ["--pipeline_parallel=3", "--microbatches=4"], re.escape(
            "--pipeline_parallel=3 does not divide the 2 workers into replicas")),
    "a cut at no layer": (
        ["--pipeline_parallel=2", "--pipeline_cuts=block9_residual2"],
        "pipeline cut point 'block9_residual2' is not a layer of model gpt"),
    "a batch that does not split": (
        ["--pipeline_parallel=2", "--microbatches=3"],
        re.escape("--batch_size=16 does not split into 3 micro-batches")),
}


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_ends_every_rank_with_one_line(shared_tmp_path, capfd, case):
    args, expected = BAD[case]
    line = refused_on_every_rank(gathered(hvdtrain_command(
        capfd, "train", *GPT, *args, f"--model_dir={shared_tmp_path / 'run'}")))
    assert re.search(expected, line), line


@pytest.mark.slow
@pytest.mark.launches(np=4)
def test_the_recipe_at_t2xp2_trains_as_one_process_and_resumes_at_d2xp2(shared_tmp_path, capfd,
                                                                      alone):
    run = shared_tmp_path / "run"
    train(capfd, run, *PIPELINED, "--tensor_parallel=2", "--epochs=1")
    # Each stage's split weights and their AdamW slots, saved whole: one
    # process's after the same epoch.
    name = "epoch-0001-step-000016"
    mine, reference = checkpointed(run, name), checkpointed(alone, name)
    assert set(mine) == set(reference)
    for variable, value in mine.items():
        np.testing.assert_allclose(value, reference[variable], rtol=0, atol=1e-5,
                                   err_msg=variable)
    # Read at D=2 x T=1 x P=2, with nothing left to train: the export is the
    # state as restored, every stage's split weights made whole again.
    written = [w.numpy() for w in exported(run).weights]
    train(capfd, run, *PIPELINED, "--epochs=1", "--resume")
    for a, b in zip(written, exported(run).weights):
        np.testing.assert_array_equal(a, b.numpy(), err_msg=b.path)


def test_a_stage_gives_values_to_its_own_weights_only_and_they_are_the_whole_models():
    layout.arrange(1)
    keras.utils.set_random_seed(5)
    start = residual(split=False).get_weights()
    layout.arrange(1, 2)
    keras.utils.set_random_seed(5)
    with pipeline_parallel.deferred():
        model = residual(split=False)
    pipelined = pipeline_parallel.Pipeline(pipeline_parallel.cut(model, at=["block"]), MICROBATCHES)
    mine = {id(v) for v in pipelined.stage.weights}
    others = [v for v in model.weights if id(v) not in mine]
    assert others and all(stage_weights.is_deferred(v) for v in others)
    values = {w.path: value for w, value in zip(model.weights, start)}
    for weight in pipelined.stage.weights:
        np.testing.assert_array_equal(weight.numpy(), values[weight.path], err_msg=weight.path)


# At np=4, what the pages on tensor and pipeline parallelism refuse, under
# each of their compositions: one line, the same on every rank.
COMPOSED = {"D2xP2": ["--pipeline_parallel=2"],
            "T2xP2": ["--pipeline_parallel=2", "--tensor_parallel=2"],
            "D2xT2": ["--tensor_parallel=2"]}
COMPOSED_BAD = {
    "D2xP2: a cut at no layer": ("D2xP2", ["--pipeline_cuts=nowhere"],
                                 "pipeline cut point 'nowhere' is not a layer of model gpt"),
    "D2xP2: mixed_float16": ("D2xP2", ["--precision=mixed_float16"],
                             "--pipeline_parallel=2: mixed_float16's loss scaling"),
    "D2xP2: the global norm": ("D2xP2", ["--global_clipnorm=1"],
                               "--pipeline_parallel=2: --global_clipnorm needs the norm"),
    "T2xP2: XLA": ("T2xP2", ["--jit_compile"], "--tensor_parallel=2: tensor-parallel layers "
                   "exchange activations inside the forward pass, which XLA cannot hold"),
    "T2xP2: a batch that does not split": ("T2xP2", ["--microbatches=3"], re.escape(
        "--batch_size=16 does not split into 3 micro-batches")),
    "T2xP2: heads not divisible": ("T2xP2", ["--option=heads=3", "--option=d_model=66"],
                                   re.escape("--option=heads=3 does not split over "
                                             "--tensor_parallel=2")),
    "T2xP2: more ranks than workers": ("T2xP2", ["--pipeline_parallel=4"], re.escape(
        "does not divide the 4 workers into replicas")),
    "D2xT2: clipping by norm": ("D2xT2", ["--clipnorm=1"],
                                "--tensor_parallel=2: clipping by norm"),
    "D2xT2: an optimizer of whole weights": ("D2xT2", ["--optimizer=lamb"],
                                             "--optimizer=lamb updates each weight as a whole"),
    "D2xT2: XLA": ("D2xT2", ["--jit_compile"], "--tensor_parallel=2: tensor-parallel layers "
                   "exchange activations inside the forward pass, which XLA cannot hold"),
}


@pytest.mark.launches(np=4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", COMPOSED_BAD, ids=list(COMPOSED_BAD))
def test_bad_input_at_each_composition_ends_every_rank_with_one_line(shared_tmp_path, capfd,
                                                                     case):
    composition, args, expected = COMPOSED_BAD[case]
    line = refused_on_every_rank(gathered(hvdtrain_command(
        capfd, "train", *GPT, *COMPOSED[composition], *args,
        f"--model_dir={shared_tmp_path / 'run'}")))
    assert re.search(expected, line), line
