"""The `hvdtrain` command in one process: the three ways to start a run
train the same recipe (as processes: the entry points are the point); help,
dry runs and every recipe's defaults (in this process)."""

import dataclasses
import sys

import pytest

from hvdtrain import recipe
from launch import REPO, hvdtrain_command, run


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["console script with flagfile", "module", "recipe script"])
def test_entry_points_train_and_write_the_model(tmp_path, entry):
    flags = [f"--model_dir={tmp_path}", "--epochs=1", "--verbose=0"]
    if entry == "console script with flagfile":
        (tmp_path / "train.flags").write_text("\n".join(flags) + "\n")
        command = ["hvdtrain", "train", f"--flagfile={tmp_path / 'train.flags'}"]
    elif entry == "module":
        # 44 steps: after 40 of warm-up no window of 10 is left to time.
        command = [sys.executable, "-m", "hvdtrain", "train", *flags,
                   "--throughput_warmup_steps=40"]
    else:
        command = [sys.executable, REPO / "recipes" / "digits_cnn.py", *flags]
    result = run(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hvdtrain: digits_cnn on 1 worker, 1 epoch in " in result.stdout
    assert f"model written to {tmp_path / 'model.keras'}" in result.stdout
    assert (tmp_path / "model.keras").stat().st_size > 0
    # Every run ends with its throughput, or says why there is none.
    if entry == "module":
        assert ("hvdtrain: throughput not measured: too few steps (a sample is 10 steps inside "
                "one epoch, after the first 40 of training;") in result.stdout
    else:
        assert "hvdtrain: throughput " in result.stdout and "not measured" not in result.stdout


def test_short_help_lists_the_training_flags(capfd):
    result = hvdtrain_command(capfd, "train", "--helpshort")
    assert result.status == 0
    assert result.stdout.startswith("usage: hvdtrain train [flags]")
    for flag in ("--recipe", "--batch_size", "--precision", "--data_dir", "--compression"):
        assert flag in result.stdout


def test_dry_run_checks_the_flags_and_trains_nothing(tmp_path, capfd):
    result = hvdtrain_command(capfd, "train", "--dry_run", "--epochs=3",
                              f"--model_dir={tmp_path / 'm'}")
    assert result.status == 0, result.stderr[-2000:]
    assert result.stdout.startswith("hvdtrain: dry run: the flags are valid; training would "
                                    "use --recipe=digits_cnn --epochs=3 --batch_size=32")
    assert not (tmp_path / "m").exists()
    bad = hvdtrain_command(capfd, "train", "--dry_run", "--epochs=0")
    assert bad.status == 2 and "--epochs must be positive" in bad.stderr


@pytest.mark.parametrize("name", recipe.available())
def test_every_recipe_accepts_its_defaults_both_ways(name, capfd):
    # As a command and as a script of its own: the settings printed are the same.
    as_command = hvdtrain_command(capfd, "train", f"--recipe={name}", "--dry_run")
    as_script = hvdtrain_command(capfd, "--dry_run", script=REPO / "recipes" / f"{name}.py")
    for result in (as_command, as_script):
        assert result.status == 0, result.stderr[-2000:]
    assert f"--recipe={name} " in as_command.stdout
    assert as_command.stdout == as_script.stdout


def test_short_help_lists_the_recipes_options(capfd):
    result = hvdtrain_command(capfd, "train", "--recipe=resnet50_synthetic", "--helpshort")
    assert result.status == 0
    assert "Options of recipe resnet50_synthetic (--option=NAME=VALUE):" in result.stdout
    assert "--option=image_size=224: height and width of the random images" in result.stdout


def test_horovodrun_passes_every_flag_through_to_the_command(monkeypatch):
    # horovodrun's argparse reads abbreviations anywhere on its command line:
    # a flag named like the start of one of its options would be taken, or refused.
    from absl import flags
    from horovod.runner import launch

    from hvdtrain import cli  # noqa: F401 (defines the flags)

    names = [f.name for f in flags.FLAGS.get_flags_for_module("hvdtrain.cli")]
    assert "recipe" in names and "stall_timeout" in names
    command = ["hvdtrain", "train", *(f"--{name}=1" for name in names)]
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "-H", "localhost:2", *command])
    assert launch.parse_args().command == command


def test_every_setting_is_a_flag_and_every_other_flag_is_the_commands_own():
    from absl import flags

    from hvdtrain import cli
    from hvdtrain.config import TrainConfig

    names = {f.name for f in flags.FLAGS.get_flags_for_module("hvdtrain.cli")}
    # The one field without a flag of its name: `options`, the recipe's own
    # settings, which --option sets.
    settings = {f.name for f in dataclasses.fields(TrainConfig)} - {"options"}
    assert names - {"option", "self_test", "dry_run", "checkpoint", "split", "output"} == \
        settings == set(cli.SETTINGS)
    # Unset, a setting's flag leaves the recipe's default (--recipe picks the recipe).
    assert [name for name in settings if flags.FLAGS[name].default is not None] == ["recipe"]


@pytest.mark.parametrize("args, script, message", [
    # The recipe's own check of the settings: what its sharded tables cannot follow
    # (the others: tests/unit/test_wide_and_deep.py).
    (["train", "--recipe=wide_and_deep", "--option=embeddings=sharded", "--jit_compile"], None,
     "tables sharded across workers (ShardedEmbedding) exchange rows inside the forward pass, "
     "which XLA cannot hold (Horovod's collectives have no XLA kernels); leave --jit_compile "
     "off"),
    # A recipe run as a script: its command line checked as `hvdtrain train`'s.
    (["--option=crosses=0x99"], "wide_and_deep.py", "--option=crosses=0x99: expected pairs of "
     "feature indices 0 to 25 like 0x1,2x3 (or empty for none)"),
], ids=["recipe check", "recipe as a script"])
def test_a_dry_run_refuses_what_the_run_would_in_one_line(capfd, args, script, message):
    bad = hvdtrain_command(capfd, *args, "--dry_run",
                           script=script and REPO / "recipes" / script)
    assert bad.status == 2
    assert [line for line in bad.stderr.splitlines() if line.startswith("hvdtrain:")] == [
        f"hvdtrain: error: {message}"]
    assert "Traceback" not in bad.stderr
