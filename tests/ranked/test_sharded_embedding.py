"""Tables sharded across workers (hvdtrain.layers.ShardedEmbedding) at np=2:

- training equals training the same model with a replicated table: SGD and
  Adagrad to round-off, lazy Adam against an independent NumPy reference;
  row-wise and table-wise placement; duplicate ids within a batch and across
  ranks; a table whose rows do not split evenly;
- wide_and_deep with --option=embeddings=sharded learns the synthetic
  log's signal as the replicated run does (under mixed_bfloat16), exports
  ordinary Embedding layers, evaluates (exported or from a checkpoint) to
  what its validation reported, resumes exactly, and resumes on another
  number of workers with the same table;
- an id out of range, a table too large for a worker, and settings the
  sparse updates cannot follow end every rank with one line naming them.
"""

import json
import re
import textwrap

import numpy as np
import pytest

from hvdtrain import runtime
from hvdtrain.state import checkpoint
from hvdtrain.tools import run_log
from launch import hvdtrain_command, run
from ranked.support import error_lines, gathered, merged
from ranked.test_wide_and_deep import SYNTHETIC, SYNTHETIC_AUC, val_auc
from workers import sharded_embedding

# Horovod's alltoall differs by controller (Gloo's own, MPI_Alltoallv): each runs some.
CASES = [("sgd", "rows", "gloo"), ("adagrad", "rows", "mpi"), ("adagrad", "table", "gloo"),
         ("adam", "rows", "mpi")]


@pytest.mark.parametrize("optimizer, placement, controller", [
    pytest.param(*case, id="-".join(case), marks=pytest.mark.launches(controllers=(case[2],)))
    for case in CASES])
def test_sharded_training_equals_the_replicated_reference(optimizer, placement, controller):
    found = gathered(sharded_embedding.train(optimizer, placement))[0]   # rank 0's
    start = np.random.default_rng(7).normal(size=found["replicated_table"].shape)
    # Lazy Adam's reference runs in float64, the layer in float32.
    tolerance = 1e-4 if optimizer == "adam" else 1e-6
    # Training moved every row well past the tolerance: the tables agree
    # because both trained alike, not because neither moved.
    assert np.abs(found["replicated_table"] - start).max(axis=1).min() > 100 * tolerance
    np.testing.assert_allclose(found["sharded_table"], found["replicated_table"], rtol=0,
                               atol=tolerance)
    np.testing.assert_allclose(found["sharded_dense"], found["replicated_dense"], rtol=0,
                               atol=tolerance)
    rows = len(start)
    assert int(found["shard_rows"]) == ((rows + 1) // 2 if placement == "rows" else rows)


TINY = ["--option=table_rows=4096", "--option=embedding_dim=8", "--option=hidden_units=32",
        "--option=synthetic_examples=4000", "--batch_size=128", "--intra_op_threads=1",
        "--deterministic"]


def train(capfd, model_dir, *args, np=2):
    """`hvdtrain train --recipe=wide_and_deep` on the ranks of this launch
    (np=2), or in one process alone that rank 0 starts while the others wait
    (np=1)."""
    command = ["train", "--recipe=wide_and_deep", f"--model_dir={model_dir}", *args]
    if np == 2:
        result = merged(hvdtrain_command(capfd, *command))
        assert result.status == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result
    alone = None
    if runtime.is_main_process():
        done = run(["hvdtrain", *command], timeout=300)
        alone = (done.returncode, done.stdout[-3000:] + done.stderr[-3000:])
    returncode, output = gathered(alone)[0]   # the others wait for rank 0's
    assert returncode == 0, output
    return None


def exported(model_dir):
    import keras
    from hvdtrain.recipes import wide_and_deep  # noqa: F401  (registers its layers)

    return keras.saving.load_model(model_dir / "model.keras", compile=False)


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_the_recipe_sharded_learns_and_exports_plain_embeddings(shared_tmp_path, capfd):
    import keras

    # The replicated run's settings and bar (tests/ranked/test_wide_and_deep.py),
    # computing in bfloat16 (the rows travel in the table's float32).
    result = train(capfd, shared_tmp_path, *SYNTHETIC, "--option=embeddings=sharded",
                   "--precision=mixed_bfloat16")
    assert val_auc(result) > SYNTHETIC_AUC
    model = exported(shared_tmp_path)
    for name in ("deep_embedding", "wide_weights"):
        layer = model.get_layer(name)
        assert type(layer) is keras.layers.Embedding
        assert layer.embeddings.shape == (8192, layer.output_dim)

    # hvdtrain evaluate builds the recipe's sharded model and gives each
    # worker its rows, of the exported table or of a checkpoint's: both
    # report what training's last validation did.
    reported = [r for r in run_log.read(shared_tmp_path) if r["event"] == "epoch"][-1]["metrics"]
    newest = checkpoint.listed(shared_tmp_path / "checkpoints")[0].name
    for source, written in ((), "evaluation-validation.json"), (
            (f"--checkpoint={newest}",), f"evaluation-validation-{newest}.json"):
        result = merged(hvdtrain_command(capfd, "evaluate", f"--model_dir={shared_tmp_path}",
                                         *source))
        assert result.status == 0, result.stdout[-3000:] + result.stderr[-3000:]
        metrics = json.loads((shared_tmp_path / written).read_text())["metrics"]
        assert metrics["auc"] == pytest.approx(reported["val_auc"], rel=1e-4), source
        assert metrics["loss"] == pytest.approx(reported["val_loss"], rel=1e-4), source


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_resumes_exactly_and_on_another_number_of_workers(shared_tmp_path, capfd):
    adam = [*TINY, "--option=embeddings=sharded"]   # lazy Adam: its moments are state too
    train(capfd, shared_tmp_path / "straight", *adam, "--epochs=2")
    train(capfd, shared_tmp_path / "resumed", *adam, "--epochs=1")
    train(capfd, shared_tmp_path / "resumed", *adam, "--epochs=2", "--resume")
    straight = exported(shared_tmp_path / "straight")
    resumed = exported(shared_tmp_path / "resumed")
    for a, b in zip(straight.weights, resumed.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    # Written by 2 workers, read by 1 (nothing left to train: the state as
    # restored is what it exports), written by 1, read by 2.
    for np_ in (1, 2):
        train(capfd, shared_tmp_path / "resumed", *adam, "--epochs=2", "--resume", np=np_)
        again = exported(shared_tmp_path / "resumed")
        for a, b in zip(straight.weights, again.weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"np={np_}: {a.path}")


RECIPE = '''
"""A recommender on ids of a table of --option=rows rows; rank 1's rows of
the data hold the id --option=bad_id when it is set (not -1)."""
import keras
import numpy as np

from hvdtrain.data import from_arrays
from hvdtrain.layers import ShardedEmbedding
from hvdtrain.recipe import Option, Recipe, Splits


def build_model(config):
    ids = keras.Input((3,), dtype="int64")
    table = ShardedEmbedding(config.options["rows"], 4, name="item_table")(ids)
    return keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(table)))


def load_data(config):
    ids = np.arange(192).reshape(64, 3) % 50
    if config.options["bad_id"] != -1:
        ids[33, 1] = config.options["bad_id"]   # row 33: rank 1's, of 2 workers
    labels = np.ones((64, 1), "float32")
    return Splits(train=from_arrays((ids, labels), config.batch_size, training=True,
                                    seed=config.seed))


RECIPE = Recipe(name="sharded_recipe", build_model=build_model, load_data=load_data,
                loss="mse", defaults=dict(epochs=1, batch_size=8, optimizer="adagrad"),
                options={"rows": Option(50, "rows"), "bad_id": Option(-1, "a bad id")})
'''

# Regular expressions of what the line says.
BAD = {
    "id past the table": (["--option=bad_id=50"], re.escape(
        "embedding table 'item_table' got id 50, outside [0, 50): check the ids")),
    "negative id": (["--option=bad_id=-7"], "embedding table 'item_table' got id -7,"),
    "table too large": (["--option=rows=1099511627776"],
                        r"embedding table 'item_table' needs 8\.0 TiB on this worker, more "
                        r"than the [\d.]+ [KMG]iB it may take"),
    # The other refusals of tests/unit/test_sharded_embedding.py come the same way.
    "optimizer without a sparse rule": (["--optimizer=rmsprop"],
                                        "RMSprop has no sparse update; use sgd, adagrad or "
                                        "adam"),
}


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_ends_every_rank_with_one_line(shared_tmp_path, capfd, case):
    recipe = shared_tmp_path / "sharded_recipe.py"
    if runtime.is_main_process():
        recipe.write_text(textwrap.dedent(RECIPE))
    runtime.barrier()
    args, expected = BAD[case]
    results = gathered(hvdtrain_command(capfd, "train", f"--recipe={recipe}",
                                        "--intra_op_threads=1",
                                        f"--model_dir={shared_tmp_path / 'run'}", *args))
    output = "".join(r.output for r in results)
    assert any(r.status != 0 for r in results), output[-3000:]
    errors = error_lines(results)
    # Both ranks find it in the same step, and print the same line.
    assert set(errors) == {0, 1} and len(set(errors.values())) == 1, output[-3000:]
    assert re.search(expected, errors[0]), errors[0]
    assert not any("Traceback" in r.output for r in results), output[-3000:]
