"""Bad input ends every rank with one clear line and a non-zero exit, never a hang."""

import pytest

from launch import horovodrun, rank_lines, run

BAD_INPUT = {
    "unknown recipe": (["--recipe=no_such_recipe"], "unknown recipe 'no_such_recipe'"),
    "zero batch size": (["--batch_size=0"], "--batch_size must be positive, got 0"),
    "negative epochs": (["--epochs=-1"], "--epochs must be positive, got -1"),
    "unreadable flagfile": (["--flagfile=/nonexistent/train.flags"], "/nonexistent/train.flags"),
    "unknown flag": (["--batch_sizee=4"], "batch_sizee"),
    "missing command": ([], "unknown command ''; use one of: train"),
    "non-finite number": (["--warmup_epochs=nan"], "--warmup_epochs must be >= 0, got nan"),
    "model_dir is a file": (["--model_dir=README.md"],
                            "--model_dir=README.md is a file, not a directory"),
    "model_dir under a file": (["--model_dir=README.md/run", "--dry_run"],
                               "--model_dir=README.md/run is under README.md, a file"),
    "model_dir not writable": (["--model_dir=/proc/hvdtrain-run", "--dry_run"],
                               "--model_dir=/proc/hvdtrain-run cannot be written"),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
def test_single_process_prints_one_line_and_exits_2(case):
    args, expected = BAD_INPUT[case]
    command = ["hvdtrain", "train", *args] if args != [] else ["hvdtrain"]
    result = run(command, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr and result.stderr.startswith("hvdtrain: error: ")
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("case", ["unknown recipe", "zero batch size", "unreadable flagfile",
                                  "model_dir is a file"])
def test_every_rank_reports_and_the_job_fails(case, controller):
    args, expected = BAD_INPUT[case]
    result = horovodrun(["hvdtrain", "train", *args], controller=controller, timeout=90)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    # Every rank that got to print before the launcher ended the job printed
    # the same line (Gloo ends the others as soon as the first one exits).
    assert errors and len(set(errors.values())) == 1, output[-2000:]
    assert expected in next(iter(errors.values()))
    assert not any("Traceback" in text for _, text in rank_lines(output))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Model directories holding one checkpoint each (its values are never
    loaded): one of digits_cnn's run, one of wide_and_deep's."""
    import dataclasses

    import numpy as np

    from hvdtrain import checkpoint
    from hvdtrain.config import TrainConfig
    from hvdtrain.training_state import Position

    root = tmp_path_factory.mktemp("evaluate")
    for recipe in ("digits_cnn", "wide_and_deep"):
        checkpoint.save(root / recipe / "checkpoints", [np.zeros(2)], Position(1, 0, 10, 2, 4),
                        dataclasses.asdict(TrainConfig(recipe=recipe)))
    return root


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
}


@pytest.mark.parametrize("case", EVALUATE_BAD_INPUT, ids=list(EVALUATE_BAD_INPUT))
def test_evaluate_names_the_problem_on_every_rank(case, runs):
    args, expected = EVALUATE_BAD_INPUT[case]
    result = horovodrun(["hvdtrain", "evaluate", *(a.format(root=runs) for a in args)],
                        timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    # The same line on every rank that printed before the launcher ended the job.
    assert errors and len(set(errors.values())) == 1, output[-3000:]
    assert next(iter(errors.values())).startswith(f"hvdtrain: error: {expected.format(root=runs)}")
    assert not any("Traceback" in text for _, text in rank_lines(output))
