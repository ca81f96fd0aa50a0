"""Preemption with real processes and real signals: a signal to one rank,
to rank 0, to the launcher, during a checkpoint save, during validation,
at an epoch's end and before the first step. Each ends with every rank
stopped after the same step, a whole checkpoint of it, status 200 on every
rank, and a resume that goes on from there.
Own launches: signals to ranks and launchers, which end their jobs."""

import os
import re
import signal

import numpy as np
import pytest

from hvdtrain.faults.preemption import EXIT_STATUS
from hvdtrain.state import checkpoint
from launch import (
    REPO,
    horovodrun,
    rank_lines,
    rank_pid,
    run,
    running,
    start,
    start_horovodrun,
    wait_until,
    worker,
)
from parallel.interrupted_runs import DIGITS
from run_checks import all_intact, ok, weights

FAULTS = REPO / "tests" / "recipes" / "faults.py"
# 89 steps an epoch at 2 x 8 (digits_cnn): the checkpoint 11 steps into the second epoch.
IN_THE_SECOND_EPOCH = "epoch-0002-step-000011"
_PREEMPTED = re.compile(r"hvdtrain: preempted \(([^)]*)\): training stands after epoch (\d+), "
                        r"step (\d+) of (\d+), in the last checkpoint; start again with --resume")


def _stopped(output, ranks=2):
    """{rank: (reason, epoch, step)} from each rank's "preempted" line; checks
    that every rank stopped at the same position."""
    found = {}
    for rank, text in rank_lines(output):
        match = _PREEMPTED.search(text)
        if match:
            found[rank] = (match.group(1), int(match.group(2)), int(match.group(3)))
    assert len(found) == ranks, output[-4000:]
    assert len({(epoch, step) for _, epoch, step in found.values()}) == 1, found
    return found


def _checkpointed_position(model_dir, stopped):
    """The newest checkpoint's position, as messages show it; every
    checkpoint is whole, and the newest is where the ranks stopped."""
    all_intact(model_dir)
    found, _ = checkpoint.read(checkpoint.listed(model_dir / "checkpoints")[0])
    (position,) = {(epoch, step) for _, epoch, step in stopped.values()}
    assert found.position.shown == position, (found.position, stopped)
    return found.position.shown


def _every_rank_exited_preempted(returncode, output):
    # horovodrun exits with the status of the first rank to exit non-zero.
    assert returncode == EXIT_STATUS, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def _start(tmp_path, flags, controller="gloo", command=("hvdtrain", "train"), env=None):
    log = tmp_path / "job.log"
    return start_horovodrun([*command, *flags], log, controller=controller, env=env), log


def _signal_when(rank, marker, condition, log, sig=signal.SIGTERM, timeout=180):
    assert wait_until(condition, timeout, interval=0.01), log.read_text()[-3000:]
    os.kill(rank_pid(rank, marker), sig)


def test_sigterm_to_one_rank_mid_epoch_and_resuming_matches_an_uninterrupted_run(
        tmp_path, controller, uninterrupted):
    reference, interrupted = uninterrupted(controller), tmp_path / "interrupted"

    job, log = _start(tmp_path, [f"--model_dir={interrupted}", *DIGITS], controller)
    _signal_when(1, str(interrupted),
                 (interrupted / "checkpoints" / IN_THE_SECOND_EPOCH).exists, log)
    returncode = job.wait(timeout=120)
    output = log.read_text()
    _every_rank_exited_preempted(returncode, output)
    stopped = _stopped(output)
    assert stopped[1][0] == "SIGTERM" and stopped[0][0] == "a signal to another worker"
    epoch, step = _checkpointed_position(interrupted, stopped)
    assert (epoch, step) > (2, 11)   # a checkpoint of its own, after the periodic one
    assert not (interrupted / "model.keras").exists()

    resumed = ok(horovodrun(["hvdtrain", "train", f"--model_dir={interrupted}", *DIGITS,
                              "--resume"], controller=controller))
    assert f"resuming from {interrupted / 'checkpoints'}" in resumed
    for a, b in zip(weights(reference), weights(interrupted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_thread_pools_are_sized_before_tensorflow_starts(controller, uninterrupted):
    """Under MPI the watchdog's board is broadcast at start-up: a TensorFlow
    op that, run before the pools were sized, left them at TF's defaults."""
    uninterrupted(controller)
    assert "its thread pools keep their sizes" not in uninterrupted.outputs[controller]


def test_sigusr1_to_rank_0_stops_every_rank_and_resumes_on_another_number_of_workers(
        tmp_path):
    model_dir = tmp_path / "model"
    job, log = _start(tmp_path, [f"--model_dir={model_dir}", *DIGITS])
    _signal_when(0, str(model_dir), (model_dir / "checkpoints" / IN_THE_SECOND_EPOCH).exists,
                 log, sig=signal.SIGUSR1)
    returncode = job.wait(timeout=120)
    output = log.read_text()
    _every_rank_exited_preempted(returncode, output)
    stopped = _stopped(output)
    assert stopped[0][0] == "SIGUSR1"
    epoch, step = _checkpointed_position(model_dir, stopped)
    # Resumed on one worker, as any checkpoint: the position counted in examples.
    resumed = ok(run(["hvdtrain", "train", f"--model_dir={model_dir}", *DIGITS, "--resume"]))
    assert (f"written by 2 workers x batch 8 after epoch {epoch}, step {step} of 89; now 1 x 8"
            in resumed), resumed[-3000:]
    assert f"going on after epoch {epoch}, step {2 * step} of 179" in resumed


# Every signal that ends a launcher: a scheduler's (SIGTERM), a closed
# terminal or ssh session (SIGHUP), a preemption notice (SIGUSR1), Ctrl-C
# sent to the launcher alone (SIGINT), and one that cannot be caught (SIGKILL).
LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGINT, signal.SIGKILL)
# And a cluster's SIGTERM to docker/resumable.sh, which the Slurm script and
# the MPIJob run horovodrun under: it passes the stop on as each launcher
# takes it, and ends with the ranks' status.
RESUMABLE = "resumable.sh SIGTERM"
# The launchers that live to end as their ranks did (status 200, after
# naming the first): horovodrun --gloo passes SIGTERM and SIGINT on to the
# ranks, horovodrun --mpi SIGUSR1 through mpirun; the others die of it.
LAUNCHERS_LIVING = {"gloo": {"SIGTERM", "SIGINT", RESUMABLE},
                    "mpi": {"SIGUSR1", RESUMABLE}}
# The stops whose checkpoints are resumed (any checkpoint resumes alike:
# tests/parallel/test_resume.py).
RESUMED = ("SIGKILL", RESUMABLE)


# Six jobs side by side, then two resumes: minutes on 2 cores.
@pytest.mark.timeout(600)
def test_a_launcher_ended_by_any_signal_stops_every_rank_with_a_checkpoint_to_resume_exactly(
        tmp_path, controller):
    """Each signal to horovodrun alone, in a job of its own (run side by
    side): rank 1 waits in its input in the second epoch until the signal
    reaches it. Under Gloo, Horovod's per-rank middlemen pass SIGTERM on to the
    ranks whose launcher died, and the ranks' output pipes are closed; under
    MPI, horovodrun passes SIGUSR1 on through mpirun, and the ranks take
    their launcher's death as a stop request for the other signals. Every
    rank stops after the same step with a checkpoint of it; those of a
    launcher killed outright and of the clusters' wrapper resume to the
    weights of an uninterrupted run."""
    flags = [f"--recipe={FAULTS}", "--epochs=2", "--checkpoint_steps=0", "--deterministic"]
    reference = tmp_path / "reference"
    ok(horovodrun(["hvdtrain", "train", *flags, f"--model_dir={reference}"],
                  controller=controller))
    cases = {sig.name: ([], sig) for sig in LAUNCHER_SIGNALS}
    cases[RESUMABLE] = ([str(REPO / "docker" / "resumable.sh")], signal.SIGTERM)
    jobs = {}
    for name, (wrapper, _) in cases.items():
        job_dir = tmp_path / name.replace(" ", "-")
        job_dir.mkdir()
        env = dict(FAULT="pause", FAULT_RANK="1", FAULT_EPOCH="1", FAULT_STEP="5",
                   FAULT_RESUME=str(job_dir / "go"), FAULT_RESUME_ON_STOP="1")
        log = job_dir / "job.log"
        jobs[name] = job_dir, start([*wrapper, "horovodrun", "-np", "2", "-H", "localhost:2",
                                     f"--{controller}", "hvdtrain", "train", *flags,
                                     f"--model_dir={job_dir / 'model'}"], log, env), log
    for job_dir, _, log in jobs.values():
        assert wait_until((job_dir / "go.waiting").exists, 240, interval=0.2), \
            log.read_text()[-3000:]
    for name, (_, launcher, _) in jobs.items():
        launcher.send_signal(cases[name][1])
    # Rank 1 reads on once its stop reaches it (FAULT_RESUME_ON_STOP: a signal
    # passed on, or its launcher seen gone), however long that takes on a
    # loaded machine: released sooner, it could end this short epoch and the
    # run first.
    for name, (job_dir, launcher, log) in jobs.items():
        launcher.wait(timeout=120)
        assert wait_until(lambda job_dir=job_dir: not running(str(job_dir / "model")), 120), name
        output = log.read_text()
        assert "Traceback" not in output, (name, output[-3000:])
        # The stop's checkpoint: the newest, inside the second epoch (rank 1's
        # input, read ahead, pauses while the steps before the 6th may still run).
        all_intact(job_dir / "model")
        newest, _ = checkpoint.read(checkpoint.listed(job_dir / "model" / "checkpoints")[0])
        assert newest.position.shown[0] == 2 and 0 < newest.position.shown[1] < 32, \
            (name, newest.position, output[-3000:])
        if launcher.returncode == EXIT_STATUS:
            # A launcher that lived to tell: every rank's stop, and the status.
            _checkpointed_position(job_dir / "model", _stopped(output))
            assert re.search(r"^horovodrun: rank \d exited with status 200$", output, re.M)
    assert {name for name, (_, launcher, _) in jobs.items()
            if launcher.returncode == EXIT_STATUS} == LAUNCHERS_LIVING[controller], \
        {name: launcher.returncode for name, (_, launcher, _) in jobs.items()}
    # Every stop above left a checkpoint of its position; two of them are
    # resumed: a launcher killed outright, and the clusters' wrapper.
    resumes = {name: start_horovodrun(["hvdtrain", "train", *flags, "--resume",
                                       f"--model_dir={job_dir / 'model'}"],
                                      job_dir / "resume.log", controller=controller)
               for name, (job_dir, *_) in jobs.items() if name in RESUMED}
    for name, resume in resumes.items():
        job_dir = jobs[name][0]
        assert resume.wait(timeout=240) == 0, (job_dir / "resume.log").read_text()[-3000:]
        for a, b in zip(weights(reference), weights(job_dir / "model"), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def _validation_epochs_in_tensorboard(model_dir):
    import tensorflow as tf

    events = (model_dir / "tensorboard" / "validation").glob("events.out.tfevents.*")
    return sum(value.tag == "epoch_accuracy" for path in events
               for event in tf.compat.v1.train.summary_iterator(str(path))
               for value in event.summary.value)


def _slow_run(tmp_path, moment, flags, seconds=2.0):
    slow_dir = tmp_path / "moments"
    slow_dir.mkdir()
    model_dir = tmp_path / "model"
    job, log = _start(tmp_path, [f"--model_dir={model_dir}", *flags],
                      command=worker("slow_moments"),
                      env={"SLOW": moment, "SLOW_SECONDS": str(seconds),
                           "SLOW_DIR": str(slow_dir)})
    return job, log, model_dir, slow_dir


def test_signals_during_a_slow_checkpoint_save_leave_it_whole_and_stop_after_it(tmp_path):
    flags = ["--epochs=3", "--batch_size=8", "--checkpoint_steps=30", "--deterministic"]
    job, log, model_dir, slow_dir = _slow_run(tmp_path, "save", flags)
    # Rank 0 writes; the second save is one inside the first epoch's steps.
    _signal_when(0, str(model_dir), (slow_dir / "save-0-2").exists, log)
    # A second signal, once the first is taken (two sent at once can arrive
    # as one: the kernel keeps one pending signal of a kind): it only prints.
    _signal_when(0, str(model_dir),
                 lambda: "stopping after the step under way" in log.read_text(), log)
    returncode = job.wait(timeout=120)
    output = log.read_text()
    _every_rank_exited_preempted(returncode, output)
    assert "already stopping (SIGTERM)" in output
    stopped = _stopped(output)
    epoch, step = _checkpointed_position(model_dir, stopped)
    # The save under way finished, then the ranks stopped one step later with one more.
    assert (epoch, step) == (1, 61), output[-3000:]
    assert [p.name for p in checkpoint.listed(model_dir / "checkpoints")] == [
        "epoch-0001-step-000061", "epoch-0001-step-000060", "epoch-0001-step-000030"]


@pytest.mark.parametrize("moment", ["validation", "epoch_end"])
def test_a_signal_between_steps_stops_at_the_epochs_end_with_its_checkpoint(tmp_path, moment):
    flags = ["--epochs=3", "--batch_size=8", "--deterministic"]
    job, log, model_dir, slow_dir = _slow_run(tmp_path, moment, flags)
    # The first epoch's validation pass or end, on rank 1.
    _signal_when(1, str(model_dir), (slow_dir / f"{moment}-1-1").exists, log)
    returncode = job.wait(timeout=120)
    output = log.read_text()
    _every_rank_exited_preempted(returncode, output)
    stopped = _stopped(output)
    assert _checkpointed_position(model_dir, stopped) == (1, 89)
    assert _validation_epochs_in_tensorboard(model_dir) == 1   # written out before the exit
    resumed = ok(horovodrun(["hvdtrain", "train", f"--model_dir={model_dir}", *flags,
                              "--resume"]))
    assert re.search(r"resuming from \S+, after epoch 1, step 89 of 89", resumed)
    assert re.search(r"on 2 workers, 2 epochs in", resumed)


def test_a_signal_before_the_first_step_stops_with_nothing_to_write(tmp_path):
    model_dir, resume = tmp_path / "model", tmp_path / "resume"
    flags = [f"--recipe={FAULTS}", f"--model_dir={model_dir}", "--epochs=1"]
    job, log = _start(tmp_path, flags, env={"FAULT": "pause_loading",
                                            "FAULT_RESUME": str(resume)})
    # Rank 1 is still loading its data: its signal waits for the start of training.
    _signal_when(1, str(model_dir), (tmp_path / "resume.waiting").exists, log)
    resume.touch()
    returncode = job.wait(timeout=120)
    output = log.read_text()
    _every_rank_exited_preempted(returncode, output)
    stopped = _stopped(output)
    assert {(epoch, step) for _, epoch, step in stopped.values()} == {(1, 0)}
    assert not checkpoint.listed(model_dir / "checkpoints")
    # The requeued job's --resume finds no checkpoint and starts from the beginning.
    resumed = ok(horovodrun(["hvdtrain", "train", *flags, "--resume"]))
    assert "training from the start" in resumed
