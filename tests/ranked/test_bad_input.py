"""Bad input at np=2 ends every rank with one clear line and a non-zero
exit, never a hang: to `hvdtrain evaluate`, and a user's recipe that builds
different models on different ranks. A recipe file is the same recipe
wherever it moves, for `--resume` and `evaluate`."""

import dataclasses
import shutil

import numpy as np
import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.state import checkpoint
from hvdtrain.state.training_state import Position
from launch import hvdtrain_command
from ranked.support import computed_once, error_lines, gathered, on_rank_0


def _runs(root):
    for recipe in ("digits_cnn", "wide_and_deep"):
        checkpoint.save(root / recipe / "checkpoints", [np.zeros(2)], Position(1, 0, 10, 2, 4),
                        dataclasses.asdict(TrainConfig(recipe=recipe)))


@pytest.fixture(scope="module")
def runs():
    """Model directories holding one checkpoint each (its values are never
    loaded): one of digits_cnn's run, one of wide_and_deep's."""
    return computed_once("evaluate-bad-input-runs", _runs)


EVALUATE_BAD_INPUT = {
    "no model": (["--model_dir={root}/none"],
                 "no model to evaluate: {root}/none/model.keras does not exist"),
    "no such checkpoint": (["--model_dir={root}/digits_cnn", "--checkpoint=epoch-9"],
                           "no checkpoint epoch-9 in {root}/digits_cnn/checkpoints; there: "
                           "epoch-0001-step-000010"),
    "another recipe's checkpoint": (
        ["--model_dir={root}/wide_and_deep", "--checkpoint=epoch-0001-step-000010",
         "--recipe=digits_cnn"],
        "{root}/wide_and_deep/checkpoints/epoch-0001-step-000010 was trained with recipe "
        "wide_and_deep, not digits_cnn: evaluate it with --recipe=wide_and_deep"),
    "unknown split": (["--model_dir={root}/digits_cnn", "--checkpoint=epoch-0001-step-000010",
                       "--split=tst"],
                      "recipe digits_cnn has no split 'tst'; choose one of validation, train"),
    # Refused before evaluating, so that no result is lost for want of a place.
    "--output is a directory": (["--model_dir={root}/digits_cnn",
                                 "--checkpoint=epoch-0001-step-000010", "--output={root}"],
                                "--output={root} is a directory; name a file to write, such as "
                                "{root}/evaluation.json"),
    "--output cannot be written": (["--model_dir={root}/digits_cnn",
                                    "--checkpoint=epoch-0001-step-000010",
                                    "--output=/proc/evaluation.json"],
                                   "--output=/proc/evaluation.json cannot be written (/proc: "),
}


# It ran one horovodrun (no controller named: Gloo).
@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", EVALUATE_BAD_INPUT, ids=list(EVALUATE_BAD_INPUT))
def test_evaluate_names_the_problem_on_every_rank(case, runs, capfd):
    args, expected = EVALUATE_BAD_INPUT[case]
    finished = gathered(hvdtrain_command(capfd, "evaluate",
                                         *(a.format(root=runs) for a in args)))
    assert any(result.status != 0 for result in finished)
    output = "".join(result.output[-3000:] for result in finished)
    errors = error_lines(finished)
    # The same line on every rank.
    assert errors and len(set(errors.values())) == 1, output
    assert next(iter(errors.values())).startswith(f"hvdtrain: error: {expected.format(root=runs)}")
    assert not any("Traceback" in result.output for result in finished)


# A user's recipe: a small regression, its model's width from $WIDTH_BY_RANK.
USER_RECIPE = """
import os

import horovod.tensorflow as hvd
import keras
import numpy as np

from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits

def build_model(config):
    width = int(os.environ.get("WIDTH_BY_RANK", "8,8").split(",")[hvd.rank()])
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width), keras.layers.Dense(1)])

def load_data(config):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 4)).astype("float32")
    arrays = (features, features.sum(axis=1))
    return Splits(train=data.from_arrays(arrays, config.batch_size, training=True),
                  validation=data.from_arrays(arrays, config.batch_size, training=False))

RECIPE = Recipe(name="user_regression", build_model=build_model, load_data=load_data,
                loss="mse", defaults=dict(epochs=1, batch_size=8, warmup_epochs=0))
"""


@pytest.fixture(scope="module")
def user_recipe():
    """A folder holding the user's recipe as `first/recipe.py`."""
    def write(root):
        (root / "first").mkdir()
        (root / "first" / "recipe.py").write_text(USER_RECIPE)
    return computed_once("user-recipe", write)


def _errors(finished):
    return {rank: [line for line in result.output.splitlines() if "hvdtrain: error:" in line]
            for rank, result in enumerate(finished)}


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
def test_a_recipe_building_different_models_on_different_ranks_is_named_in_one_line(
        user_recipe, capfd, monkeypatch):
    monkeypatch.setenv("WIDTH_BY_RANK", "8,16")
    finished = gathered(hvdtrain_command(
        capfd, "train", f"--recipe={user_recipe / 'first' / 'recipe.py'}",
        f"--model_dir={user_recipe / 'different'}"))
    assert [result.status for result in finished] == [2, 2]
    expected = ("hvdtrain: error: recipe user_regression builds different models on ranks 0 "
                "and 1 (sequential/dense/kernel [4, 8] float32 on rank 0, sequential/dense/kernel "
                "[4, 16] float32 on rank 1); build_model must build the same model on every "
                "rank, from the config alone")
    assert _errors(finished) == {0: [expected], 1: [expected]}
    assert not any("Traceback" in result.output for result in finished)


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(180)
def test_a_moved_recipe_file_resumes_and_evaluates_as_the_same_recipe(user_recipe, capfd):
    """Trained from one spelling of its path, resumed after the file moved,
    evaluated after it moved again: refused without its new path (naming
    the one it had), evaluated with it."""
    model_dir = user_recipe / "moved-run"
    second, third = user_recipe / "second" / "recipe.py", user_recipe / "third" / "recipe.py"

    def move(source, target):
        target.parent.mkdir()
        shutil.move(source, target)

    trained = gathered(hvdtrain_command(capfd, "train", f"--recipe={user_recipe}/first/../first/"
                                        "recipe.py", f"--model_dir={model_dir}"))
    assert [result.status for result in trained] == [0, 0], trained[0].output[-3000:]
    on_rank_0(move, user_recipe / "first" / "recipe.py", second)
    resumed = gathered(hvdtrain_command(capfd, "train", f"--recipe={second}",
                                        f"--model_dir={model_dir}", "--resume", "--epochs=2"))
    assert [result.status for result in resumed] == [0, 0], resumed[0].output[-3000:]
    assert "resuming from" in resumed[0].output, resumed[0].output[-3000:]
    on_rank_0(move, second, third)
    gone = gathered(hvdtrain_command(capfd, "evaluate", f"--model_dir={model_dir}"))
    expected = (f"hvdtrain: error: {model_dir}/model.keras was trained with the recipe file "
                f"{second}, which is gone; give the file's path now with --recipe")
    assert _errors(gone) == {0: [expected], 1: [expected]}
    evaluated = gathered(hvdtrain_command(capfd, "evaluate", f"--recipe={third}",
                                          f"--model_dir={model_dir}"))
    assert [result.status for result in evaluated] == [0, 0], evaluated[0].output[-3000:]
