"""Checkpoints and resuming, with real processes and real signals: a worker
killed mid-epoch, and rank 0 killed while it writes a checkpoint.
Own launches: each kills a rank of its job with SIGKILL while the other runs.
(The rest, run on every rank of a shared launch: tests/ranked/test_resume.py.)"""

import os
import re
import signal

import numpy as np

from hvdtrain.state import checkpoint
from launch import REPO, horovodrun, rank_pid, start_horovodrun, wait_until
from parallel.interrupted_runs import DIGITS
from run_checks import all_intact, final_accuracy, ok, weights

WIDE = REPO / "tests" / "recipes" / "wide_digits.py"
# What horovodrun says when a rank dies of SIGKILL, under either controller.
LOST_RANK = "horovodrun: rank {rank} exited with status 137"


def _train(model_dir, *flags, controller="gloo"):
    return horovodrun(["hvdtrain", "train", f"--model_dir={model_dir}", *flags],
                      controller=controller)


def _kill_when(process, log, marker, rank, condition, timeout=120):
    """Kills rank `rank` with SIGKILL once `condition()` holds; returns the
    job's exit code and output."""
    assert wait_until(condition, timeout), open(log).read()[-3000:]
    os.kill(rank_pid(rank, marker), signal.SIGKILL)
    returncode = process.wait(timeout=120)  # a hang fails the test here
    return returncode, open(log).read()


def test_killed_worker_ends_the_job_and_resuming_matches_an_uninterrupted_run(
        tmp_path, controller, uninterrupted):
    reference, interrupted = uninterrupted(controller), tmp_path / "interrupted"

    log = tmp_path / "killed.log"
    job = start_horovodrun(["hvdtrain", "train", f"--model_dir={interrupted}", *DIGITS], log,
                           controller=controller)
    # 89 steps an epoch: kill rank 1 in the second epoch, after its second checkpoint.
    returncode, output = _kill_when(
        job, log, str(interrupted), 1,
        lambda: (interrupted / "checkpoints" / "epoch-0002-step-000011").exists())
    # horovodrun ends as the first rank to fail did, as the shell reports a SIGKILL.
    assert returncode == 137, output[-3000:]
    assert LOST_RANK.format(rank=1) in output, output[-3000:]
    assert "epoch-0002-step-000011" in all_intact(interrupted)
    assert not (interrupted / "model.keras").exists()

    resumed = ok(_train(interrupted, *DIGITS, "--resume", controller=controller))
    epoch, step = map(int, re.search(r"resuming from \S+, after epoch (\d+), step (\d+) of 89",
                                     resumed).groups())
    assert epoch == 2 and step > 0   # in the middle of the second epoch
    assert final_accuracy(resumed) > 0.85
    for a, b in zip(weights(reference), weights(interrupted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_rank0_killed_while_writing_a_checkpoint_leaves_every_checkpoint_whole(tmp_path):
    model_dir = tmp_path / "model"
    flags = [f"--recipe={WIDE}", f"--model_dir={model_dir}", "--checkpoint_steps=5"]
    log = tmp_path / "killed.log"
    job = start_horovodrun(["hvdtrain", "train", *flags], log)

    def saving_after_the_first():
        return len(checkpoint.listed(model_dir / "checkpoints")) >= 1 and any(
            p.name.startswith(".tmp-") for p in (model_dir / "checkpoints").iterdir())

    returncode, output = _kill_when(job, log, str(model_dir), 0, saving_after_the_first)
    assert returncode != 0
    assert LOST_RANK.format(rank=0) in output, output[-3000:]
    left = [p.name for p in (model_dir / "checkpoints").iterdir()]
    assert any(name.startswith(".tmp-") for name in left)   # the save the kill cut short
    assert len(all_intact(model_dir)) >= 1

    resumed = ok(_train(model_dir, *flags[:1], *flags[2:], "--resume"))
    assert "resuming from" in resumed
    assert not any(p.name.startswith(".tmp-") for p in (model_dir / "checkpoints").iterdir())
    # Trained on (2 epochs, chance 0.1): where the kill fell moves it by a few points.
    assert final_accuracy(resumed) > 0.8
