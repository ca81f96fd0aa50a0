"""What the tests of interrupted runs share (test_resume.py: killed ranks;
test_preemption.py: signals): the digits_cnn run they interrupt, and the
uninterrupted run its resumption must end at."""

import fcntl

from launch import horovodrun
from run_checks import ok

# 89 steps an epoch at 2 x 8, a checkpoint every 10 steps.
DIGITS = ["--epochs=3", "--batch_size=8", "--checkpoint_steps=10", "--deterministic"]


class Uninterrupted:
    """DIGITS trained to the end without interruption, once per controller
    in a session, in `shared_dir` (which the session's xdist workers share:
    the first to ask trains it, under a lock the others wait at): every
    interrupted run of it must resume to these weights."""

    def __init__(self, shared_dir):
        self._shared_dir = shared_dir
        self.outputs = {}

    def __call__(self, controller):
        """The run's model directory under `controller`."""
        run_dir = self._shared_dir / f"uninterrupted-{controller}"
        output = run_dir / "output.txt"
        with open(f"{run_dir}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not output.exists():
                run_dir.mkdir(exist_ok=True)
                text = ok(horovodrun(["hvdtrain", "train", f"--model_dir={run_dir / 'model'}",
                                      *DIGITS], controller=controller))
                output.write_text(text)
        self.outputs[controller] = output.read_text()
        return run_dir / "model"
