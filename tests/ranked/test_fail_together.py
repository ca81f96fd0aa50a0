"""A non-finite loss on one rank under --nan_policy=ignore: every rank trains
to the end, keeps the good checkpoints and refuses to write the model.
(A rank that fails or hangs while the others run: tests/parallel/test_fail_together.py.)"""

import pytest

from hvdtrain.state import checkpoint
from launch import REPO, hvdtrain_command
from ranked.support import gathered

FAULTS = REPO / "tests" / "recipes" / "faults.py"


def _train(capfd, monkeypatch, model_dir, fault, *flags):
    # faults.py reads these when it loads the data and at each epoch: set on
    # every rank for the whole run, as horovodrun's env= set them.
    for name, value in dict(FAULT=fault, FAULT_RANK="1", FAULT_EPOCH="1",
                            FAULT_STEP="5").items():
        monkeypatch.setenv(name, value)
    return hvdtrain_command(capfd, "train", f"--recipe={FAULTS}", f"--model_dir={model_dir}",
                            "--checkpoint_steps=4", *flags)


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(120)
def test_with_nan_policy_ignore_training_goes_on_and_keeps_good_checkpoints(shared_tmp_path,
                                                                            capfd, monkeypatch):
    model_dir = shared_tmp_path / "model"
    result = _train(capfd, monkeypatch, model_dir, "nan", "--nan_policy=ignore")
    statuses, stdouts, stderrs = zip(*gathered((result.status, result.stdout, result.stderr)))
    names = [p.name for p in checkpoint.listed(model_dir / "checkpoints")]
    # After the NaN no state is finite, so no checkpoint was written after it.
    assert names[0] == "epoch-0002-step-000004"
    assert "no checkpoint written" in "".join(stderrs)
    # Nor a model: the run trained to the end, but what it holds is not a trained model.
    assert statuses == (1, 1), "".join(stderr[-3000:] for stderr in stderrs)
    line = ("hvdtrain: error: training ended with weights that are not finite (NaN or "
            "infinite): no model written; lower --learning_rate or check the data, then resume "
            f"from the last checkpoint in {model_dir / 'checkpoints'}")
    assert {rank for rank, (stdout, stderr) in enumerate(zip(stdouts, stderrs))
            for text in (stdout + stderr).splitlines() if text == line} == {0, 1}
    assert "model written" not in "".join(stdouts)
    assert not (model_dir / "model.keras").exists()
