"""What the tests of interrupted runs share (test_resume.py: killed ranks;
test_preemption.py: signals): the digits_cnn run they interrupt, and the
uninterrupted run its resumption must end at."""

from launch import horovodrun
from run_checks import ok

# 89 steps an epoch at 2 x 8, a checkpoint every 10 steps.
DIGITS = ["--epochs=3", "--batch_size=8", "--checkpoint_steps=10", "--deterministic"]


class Uninterrupted:
    """DIGITS trained to the end without interruption, once per controller
    in a session: every interrupted run of it must resume to these weights."""

    def __init__(self, tmp_path_factory):
        self._tmp_path_factory = tmp_path_factory
        self._runs = {}
        self.outputs = {}

    def __call__(self, controller):
        """The run's model directory under `controller`."""
        if controller not in self._runs:
            model_dir = self._tmp_path_factory.mktemp(f"uninterrupted-{controller}") / "model"
            self.outputs[controller] = ok(horovodrun(
                ["hvdtrain", "train", f"--model_dir={model_dir}", *DIGITS], controller=controller))
            self._runs[controller] = model_dir
        return self._runs[controller]
