"""One run per model directory: a job finds it owned by another process
(one line naming the owner, exit 2), and a killed owner blocks nobody."""

import re
import signal
import subprocess
import sys

import pytest

from launch import REPO, environment, run

HOLD = ("import sys, time; import horovod.tensorflow as hvd; hvd.init(); "
        "from hvdtrain.state import run_lock; run_lock.acquire(sys.argv[1]); "
        "print('owned', flush=True); time.sleep(600)")


def _hold(model_dir):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(model_dir)], cwd=REPO,
                              env=environment(None), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "owned\n"
    return holder


@pytest.mark.slow
def test_a_model_dir_owned_by_a_live_process_is_refused_and_a_killed_ones_is_not(tmp_path):
    model_dir = tmp_path / "model"
    holder = _hold(model_dir)
    try:
        result = run(["hvdtrain", "train", f"--recipe={REPO / 'tests' / 'recipes' / 'faults.py'}",
                      f"--model_dir={model_dir}", "--epochs=1"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "hvdtrain: error:" in line]
    assert len(errors) == 1 and re.fullmatch(
        rf"hvdtrain: error: {re.escape(str(model_dir))} is in use by another run \(host \S+, "
        rf"pid {holder.pid}, since \S+\); wait for it to end or choose another --model_dir",
        errors[0]), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # The kernel dropped the dead owner's lock.
    again = _hold(model_dir)
    again.kill()
    again.wait()
