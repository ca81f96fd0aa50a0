"""Bad input to `hvdtrain evaluate` at np=2 ends every rank with one clear
line and a non-zero exit, never a hang."""

import dataclasses

import numpy as np
import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.state import checkpoint
from hvdtrain.state.training_state import Position
from launch import hvdtrain_command
from ranked.support import computed_once, gathered


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
    errors = {rank: text for rank, result in enumerate(finished)
              for text in result.output.splitlines() if "hvdtrain: error:" in text}
    # The same line on every rank.
    assert errors and len(set(errors.values())) == 1, output
    assert next(iter(errors.values())).startswith(f"hvdtrain: error: {expected.format(root=runs)}")
    assert not any("Traceback" in result.output for result in finished)
