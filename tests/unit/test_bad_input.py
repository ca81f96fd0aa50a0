"""Bad input to `hvdtrain` run alone ends it with one clear line and exit 2
(at np=2: tests/parallel/test_bad_input.py and tests/ranked/test_bad_input.py)."""

import pytest

from launch import run

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

