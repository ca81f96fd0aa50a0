"""A fault on one rank ends every rank promptly with that rank's message: a
non-finite loss (--nan_policy=fail), and a rank that hangs, in its input
pipeline or before training (Horovod's stall check, told by hvdtrain to shut
down, or hvdtrain's watchdog ends the job, naming the hung rank); so does a
pipeline's stage that fails or hangs.
Own launches: one rank exits or hangs while the other runs, and the job's end is the point.
(--nan_policy=ignore, where every rank trains on: tests/ranked/test_fail_together.py.)"""

import re
import subprocess

import numpy as np

from hvdtrain.state import checkpoint
from launch import REPO, horovodrun, rank_lines, start_horovodrun

FAULTS = REPO / "tests" / "recipes" / "faults.py"


def _args(tmp_path, *flags):
    return ["hvdtrain", "train", f"--recipe={FAULTS}", f"--model_dir={tmp_path / 'model'}",
            "--checkpoint_steps=4", *flags]


def _fault(fault, **env):
    return dict(FAULT=fault, FAULT_RANK="1", FAULT_EPOCH="1", FAULT_STEP="5") | env


def _train(tmp_path, controller, fault, *flags, env=None):
    return horovodrun(_args(tmp_path, *flags), controller=controller, timeout=120,
                      env=_fault(fault, **(env or {})))


def _errors(result):
    return [(rank, text) for rank, text in rank_lines(result.stdout + result.stderr)
            if text.startswith("hvdtrain: error:")]


def _errors_text(result):
    return [text for _, text in _errors(result)]


def test_a_nan_loss_on_one_rank_ends_every_rank_with_its_message(tmp_path, controller):
    result = _train(tmp_path, controller, "nan")
    # A failure: status 1 from horovodrun, after its line naming the first rank to fail.
    assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
    assert re.search(r"^horovodrun: rank [01] exited with status 1$", result.stderr, re.M), \
        result.stderr[-3000:]
    errors = _errors(result)
    # Rank 1's loss is NaN at the 6th step of the 2nd epoch; rank 0's a step
    # later (the averaged gradients carried the NaN), unless stopped first.
    assert (1, "hvdtrain: error: the loss is nan at epoch 2, step 6 on rank 1; lower "
               "--learning_rate or check the data, then resume from the last checkpoint "
               "(or keep going with --nan_policy=ignore)") in errors
    assert {rank for rank, _ in errors} <= {0, 1}
    assert not any("Traceback" in text for _, text in rank_lines(result.stderr))
    # No checkpoint holds the diverged state.
    names = [p.name for p in checkpoint.listed(tmp_path / "model" / "checkpoints")]
    assert names[0] == "epoch-0002-step-000004"
    for name in names:
        _, values = checkpoint.read(tmp_path / "model" / "checkpoints" / name)
        assert all(np.isfinite(v).all() for v in values if v.dtype.kind == "f")


def test_a_hung_worker_ends_the_job(tmp_path):
    """Under Gloo and MPI, side by side: most of each run is the wait."""
    jobs = {}
    for controller in ("gloo", "mpi"):
        (tmp_path / controller).mkdir()
        log = tmp_path / controller / "log"
        jobs[controller] = log, start_horovodrun(
            _args(tmp_path / controller, "--stall_timeout=6"), log, controller=controller,
            env=_fault("hang"))
    for controller, (log, job) in jobs.items():
        result = subprocess.CompletedProcess(job.args, job.wait(timeout=120), log.read_text(), "")
        assert result.returncode != 0
        output = result.stdout
        # hvdtrain's watchdog ends the job, naming the rank whose input hangs...
        named = any(text.startswith("hvdtrain: error: no progress for 18 s: rank 1 stopped "
                                    "making progress (rank 1 on ")
                    and ": training epoch 2, step 6, idle " in text
                    and "; rank 0 waits for it in a collective" in text
                    for text in _errors_text(result))
        if controller == "mpi":
            # ... unless Horovod's stall check shuts down first, naming the rank
            # that submitted no tensors.
            assert named or "Missing ranks:" in output and "1!: [" in output, output[-3000:]
        else:
            assert named, output[-3000:]


def test_a_rank_hung_before_training_is_named_and_ends_the_job(tmp_path):
    # Horovod's stall check never acts under Gloo; the watchdog (3 x 2 s) does.
    result = _train(tmp_path, "gloo", "hang_loading", "--stall_timeout=2")
    assert result.returncode != 0
    assert any(text.startswith("hvdtrain: error: no progress for 6 s: rank 1 stopped making "
                               "progress (rank 1 on ") and ": loading data, idle " in text
               and "; rank 0 waits for it in a collective; stopping the job" in text
               for text in _errors_text(result)), (result.stdout + result.stderr)[-3000:]


def test_a_stage_that_fails_or_hangs_ends_every_stage_of_a_pipeline(tmp_path):
    """Two stages under Gloo, side by side: the first stage makes a NaN that
    the last one's loss finds; the last stage's input hangs while the first
    waits for its gradients."""
    jobs = {}
    for fault, rank in (("nan", "0"), ("hang", "1")):
        (tmp_path / fault).mkdir()
        log = tmp_path / fault / "log"
        jobs[fault] = log, start_horovodrun(
            _args(tmp_path / fault, "--pipeline_parallel=2", "--microbatches=2",
                  "--stall_timeout=6"), log, controller="gloo",
            env=_fault(fault, FAULT_RANK=rank))
    results = {fault: subprocess.CompletedProcess(job.args, job.wait(timeout=120),
                                                  log.read_text(), "")
               for fault, (log, job) in jobs.items()}
    failed = results["nan"]
    assert failed.returncode == 1, failed.stdout[-3000:]
    # The loss, on the last stage, is every stage's: both see it at once.
    assert any(re.fullmatch(r"hvdtrain: error: the loss is nan at epoch 2, step 6 on rank [01]; "
                            r"lower --learning_rate .*", text)
               for text in _errors_text(failed)), failed.stdout[-3000:]
    hung = results["hang"]
    assert hung.returncode != 0
    assert any(text.startswith("hvdtrain: error: no progress for 18 s: rank 1 stopped making "
                               "progress (rank 1 on ") and ": training epoch 2, step 6, idle "
               in text and "; rank 0 waits for it in a collective" in text
               for text in _errors_text(hung)), hung.stdout[-3000:]
