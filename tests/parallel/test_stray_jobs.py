"""Jobs that must not run unsupervised or side by side: workers whose
launcher was killed stop (under MPI too, where mpirun outlives horovodrun),
and a second job on a --model_dir in use is refused.
Own launches: launchers killed, and two jobs at once."""

import os
import re
import signal

from hvdtrain.faults import launcher_watch
from hvdtrain.state import export
from launch import REPO, horovodrun, rank_lines, rank_pid, start_horovodrun, wait_until

FAULTS = REPO / "tests" / "recipes" / "faults.py"


def _args(model_dir, *flags):
    return ["hvdtrain", "train", f"--recipe={FAULTS}", f"--model_dir={model_dir}",
            "--epochs=2", *flags]


def _paused(tmp_path):
    """Rank 1's input blocks at the 3rd step until the file `go` exists."""
    return dict(FAULT="pause", FAULT_RANK="1", FAULT_EPOCH="0", FAULT_STEP="2",
                FAULT_RESUME=str(tmp_path / "go"))


def _owned(model_dir):
    """Rank 0 took the model directory (and so is past init)."""
    lock = model_dir / "run.lock"
    return lambda: lock.exists() and "pid" in lock.read_text()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_stop_when_horovodrun_is_killed_under_mpi(tmp_path):
    """SIGTERM and SIGKILL, each to a job of its own: run side by side, their
    workers wait out the grace together."""
    jobs = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        job_dir = tmp_path / sig.name
        job_dir.mkdir()
        jobs[sig] = job_dir, start_horovodrun(_args(job_dir / "model"), job_dir / "log",
                                              controller="mpi", env=_paused(job_dir))
    workers = []
    try:
        # Rank 1 blocked in its input: a launcher killed before that lets the
        # ranks agree on a step to stop at, and the grace goes untested.
        for job_dir, _ in jobs.values():
            assert wait_until((job_dir / "go.waiting").exists, 180, interval=0.5), \
                (job_dir / "log").read_text()
        for sig, (job_dir, launcher) in jobs.items():
            workers += [rank_pid(rank, str(job_dir / "model")) for rank in (0, 1)]
            launcher.send_signal(sig)
            launcher.wait(timeout=30)
        # Rank 1 is stuck in its input, so the stop the launcher's exit asks
        # for cannot happen at a step: the workers exit after the grace.
        grace = launcher_watch._STOP_GRACE_SECONDS
        assert wait_until(lambda: not any(map(_alive, workers)), grace + 30, interval=0.2), \
            "".join((job_dir / "log").read_text()[-3000:] for job_dir, _ in jobs.values())
    finally:
        for job_dir, _ in jobs.values():
            (job_dir / "go").touch()
        for pid in filter(_alive, workers):
            os.kill(pid, signal.SIGKILL)
    for job_dir, _ in jobs.values():
        assert not (job_dir / "model" / export.KERAS_FILE).exists()


def test_a_second_job_on_a_model_dir_in_use_is_refused(tmp_path):
    model_dir = tmp_path / "model"
    first = start_horovodrun(_args(model_dir), tmp_path / "first.log", env=_paused(tmp_path))
    try:
        assert wait_until(_owned(model_dir), 180, interval=0.5), \
            (tmp_path / "first.log").read_text()
        owner = rank_pid(0, str(model_dir))
        second = horovodrun(_args(model_dir), timeout=120)
    finally:
        (tmp_path / "go").touch()
    errors = {rank: text for rank, text in rank_lines(second.stdout + second.stderr)
              if "hvdtrain: error:" in text}
    assert second.returncode != 0
    assert set(errors) == {0, 1}, (second.stdout + second.stderr)[-3000:]
    for text in errors.values():
        assert re.fullmatch(
            rf"hvdtrain: error: {re.escape(str(model_dir))} is in use by another run \(host "
            rf"\S+, pid {owner}, since \S+\); wait for it to end or choose another --model_dir"
            r"( \(found by rank 0\))?", text), text
    assert first.wait(timeout=180) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert (model_dir / export.KERAS_FILE).exists()
    resumed = horovodrun(_args(model_dir, "--epochs=3", "--resume"), timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
