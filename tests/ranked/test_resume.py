"""Checkpoints and resuming, `hvdtrain train` run on every rank: a damaged
newest checkpoint, resuming on a different number of workers, the exports,
a fresh run refusing an earlier run's checkpoints, and mixed precision's
state in a checkpoint. (Killed ranks: tests/parallel/test_resume.py.)"""

import json
import re
import shutil

import horovod.tensorflow as hvd
import keras
import numpy as np
import pytest
import tensorflow as tf

import run_checks
from hvdtrain.state import checkpoint
from launch import REPO, hvdtrain_command, run
from ranked.support import gathered, on_rank_0
from run_checks import all_intact, final_accuracy

# As they ran under `horovodrun` (Gloo) before: Gloo only. Each trains a recipe.
pytestmark = [pytest.mark.launches(controllers=("gloo",)), pytest.mark.slow]


def _train(capfd, model_dir, *flags):
    """`hvdtrain train` on every rank: how it ended there."""
    return hvdtrain_command(capfd, "train", f"--model_dir={model_dir}", *flags)


def _ok(finished):
    """Every rank's run succeeded: their output together (as horovodrun's)."""
    statuses, outputs = zip(*gathered((finished.status, finished.output)))
    assert statuses == (0,) * hvd.size(), "".join(o[-3000:] for o in outputs)
    return "".join(outputs)


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(shared_tmp_path, capfd):
    model_dir = shared_tmp_path / "model"
    _ok(_train(capfd, model_dir, "--epochs=2"))

    def damage():
        newest = model_dir / "checkpoints" / "epoch-0002-step-000022" / checkpoint.VARIABLES
        newest.write_bytes(newest.read_bytes()[:1000])   # as a full disk leaves it

    on_rank_0(damage)

    output = _ok(_train(capfd, model_dir, "--epochs=4", "--resume"))
    assert "epoch-0002-step-000022 is damaged" in output
    assert re.search(r"resuming from \S+epoch-0001-step-000022, after epoch 1, step 22 of 22",
                     output)
    assert final_accuracy(output) > 0.9


def test_resuming_on_fewer_workers_rescales_the_learning_rate_and_the_steps(shared_tmp_path,
                                                                             capfd):
    model_dir = shared_tmp_path / "model"
    _ok(_train(capfd, model_dir, "--epochs=2", "--checkpoint_steps=10", "--warmup_epochs=1"))

    def leave_a_checkpoint_in_the_second_epoch():
        # Leave a checkpoint from the middle of the second epoch as the newest:
        # 22 steps an epoch at 2 x 32, so global step 40 is step 18 of epoch 2.
        names = all_intact(model_dir)
        assert names[0] == "epoch-0002-step-000022"
        shutil.rmtree(model_dir / "checkpoints" / names[0])
        assert all_intact(model_dir)[0] == "epoch-0002-step-000018"

    on_rank_0(leave_a_checkpoint_in_the_second_epoch)

    def train_on_one_worker():
        # One process alone, started from rank 0 (the launch's variables scrubbed).
        return run_checks.ok(run(["hvdtrain", "train", f"--model_dir={model_dir}", "--epochs=4",
                              "--warmup_epochs=1", "--resume"]))

    output = on_rank_0(train_on_one_worker)
    # 18 steps x 2 workers x 32 = 1152 examples = step 36 of 44 for one worker.
    assert ("written by 2 workers x batch 32 after epoch 2, step 18 of 22; now 1 x 32: learning "
            "rate scaled for 1 workers, steps recomputed, going on after epoch 2, step 36 of 44"
            ) in output
    assert final_accuracy(output) > 0.9
    restored = keras.saving.load_model(model_dir / "model.keras")
    assert float(restored.optimizer.learning_rate) == pytest.approx(0.02)   # one worker's


def test_exports_give_the_trained_models_predictions(shared_tmp_path, capfd):
    model_dir = shared_tmp_path / "model"
    output = _ok(_train(capfd, model_dir, "--epochs=1", "--best_metric=val_accuracy"))
    images = np.random.default_rng(0).uniform(size=(16, 8, 8, 1)).astype("float32")
    from_keras = keras.saving.load_model(model_dir / "model.keras").predict(images, verbose=0)
    served = tf.saved_model.load(str(model_dir / "saved_model"))
    from_saved_model = served.serve(tf.constant(images)).numpy()
    np.testing.assert_allclose(from_keras, from_saved_model, rtol=1e-5, atol=1e-5)
    # The last checkpoint holds the same weights, and the metric it was kept by.
    from hvdtrain.recipes import digits_cnn
    model = digits_cnn.build_model(None)
    found, values = checkpoint.read(checkpoint.listed(model_dir / "checkpoints")[0])
    for variable, value in zip(model.variables, values):
        variable.assign(value)
    np.testing.assert_allclose(model.predict(images, verbose=0), from_keras, rtol=1e-5,
                               atol=1e-5)
    assert found.metric == pytest.approx(final_accuracy(output), abs=1e-4)


def test_a_fresh_run_refuses_to_mix_with_an_earlier_runs_checkpoints(shared_tmp_path, capfd):
    model_dir = shared_tmp_path / "model"
    _ok(_train(capfd, model_dir, "--epochs=1"))
    result = _train(capfd, model_dir, "--epochs=1")
    statuses, stderrs = zip(*gathered((result.status, result.stderr)))
    assert any(status != 0 for status in statuses)   # horovodrun's status: not 0
    errors = {line for stderr in stderrs for line in stderr.splitlines()
              if "hvdtrain: error:" in line}
    assert errors == {f"hvdtrain: error: {model_dir / 'checkpoints'} holds checkpoints of an "
                      "earlier run; pass --resume to go on from them, or choose another "
                      "--model_dir (found by rank 0)"}


def test_mixed_precision_state_and_accumulated_gradients_are_checkpointed(shared_tmp_path,
                                                                           capfd):
    model_dir, faults = shared_tmp_path / "model", REPO / "tests" / "recipes" / "faults.py"
    flags = [f"--recipe={faults}", "--precision=mixed_float16", "--backward_passes_per_step=3",
             "--checkpoint_steps=7"]
    _ok(_train(capfd, model_dir, *flags, "--epochs=1"))
    names = json.loads((model_dir / "checkpoints" / "epoch-0001-step-000028" /
                        checkpoint.META).read_text())["names"]
    for name in ("loss_scale_optimizer/dynamic_scale", "loss_scale_optimizer/step_counter",
                 "loss_scale_optimizer/iteration", "hvd_passes"):
        assert any(n.endswith(name) for n in names), (name, names)
    assert sum("hvd_accumulated" in n for n in names) == 4   # one per weight, mid-accumulation
    output = _ok(_train(capfd, model_dir, *flags, "--epochs=2", "--resume"))
    assert re.search(r"resuming from \S+epoch-0001-step-0000(\d\d), after epoch 1, "
                     r"step \1 of \1\b", output)
    assert final_accuracy(output) > 0.9
