"""Checkpoints and resuming, with real processes and real signals: a worker
killed mid-epoch, rank 0 killed while it writes a checkpoint, a damaged
newest checkpoint, and resuming on a different number of workers."""

import json
import os
import re
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvdtrain import checkpoint
from launch import REPO, horovodrun, rank_lines, rank_pid, run, start_horovodrun, wait_until

WIDE = REPO / "tests" / "recipes" / "wide_digits.py"
# What each launcher says when a rank dies: horovodrun's Gloo driver, mpirun.
LOST_RANK = {"gloo": r"Process name: {rank}\nExit code: 137",
             "mpi": r"process rank {rank} with PID \d+ on node \S+ exited on signal 9"}


def _train(model_dir, *flags, np=2, controller="gloo"):
    args = ["hvdtrain", "train", f"--model_dir={model_dir}", *flags]
    return horovodrun(args, np=np, controller=controller) if np > 1 else run(args)


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _final_accuracy(output):
    return float(re.search(r"val_accuracy (\d\.\d+)", output).group(1))


def _weights(model_dir):
    return keras.saving.load_model(model_dir / "model.keras").get_weights()


def _all_intact(model_dir):
    paths = checkpoint.listed(model_dir / "checkpoints")
    for path in paths:
        checkpoint.read(path)  # raises if damaged
    return [p.name for p in paths]


def _kill_when(process, log, marker, rank, condition, timeout=120):
    """Kills rank `rank` with SIGKILL once `condition()` holds; returns the
    job's exit code and output."""
    assert wait_until(condition, timeout), open(log).read()[-3000:]
    os.kill(rank_pid(rank, marker), signal.SIGKILL)
    returncode = process.wait(timeout=120)  # a hang fails the test here
    return returncode, open(log).read()


DIGITS = ["--epochs=3", "--batch_size=8", "--checkpoint_steps=10", "--deterministic"]


def test_killed_worker_ends_the_job_and_resuming_matches_an_uninterrupted_run(
        tmp_path, controller):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    _ok(_train(reference, *DIGITS, controller=controller))

    log = tmp_path / "killed.log"
    job = start_horovodrun(["hvdtrain", "train", f"--model_dir={interrupted}", *DIGITS], log,
                           controller=controller)
    # 89 steps an epoch: kill rank 1 in the second epoch, after its second checkpoint.
    returncode, output = _kill_when(
        job, log, str(interrupted), 1,
        lambda: (interrupted / "checkpoints" / "epoch-0002-step-000011").exists())
    assert returncode != 0
    assert re.search(LOST_RANK[controller].format(rank=1), output), output[-3000:]
    assert "epoch-0002-step-000011" in _all_intact(interrupted)
    assert not (interrupted / "model.keras").exists()

    resumed = _ok(_train(interrupted, *DIGITS, "--resume", controller=controller))
    epoch, step = map(int, re.search(r"resuming from \S+, after epoch (\d+), step (\d+) of 89",
                                     resumed).groups())
    assert epoch == 2 and step > 0   # in the middle of the second epoch
    assert _final_accuracy(resumed) > 0.85
    for a, b in zip(_weights(reference), _weights(interrupted), strict=True):
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
    assert re.search(LOST_RANK["gloo"].format(rank=0), output), output[-3000:]
    left = [p.name for p in (model_dir / "checkpoints").iterdir()]
    assert any(name.startswith(".tmp-") for name in left)   # the save the kill cut short
    assert len(_all_intact(model_dir)) >= 1

    resumed = _ok(_train(model_dir, *flags[:1], *flags[2:], "--resume"))
    assert "resuming from" in resumed
    assert not any(p.name.startswith(".tmp-") for p in (model_dir / "checkpoints").iterdir())
    # Trained on (2 epochs, chance 0.1): where the kill fell moves it by a few points.
    assert _final_accuracy(resumed) > 0.8


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(tmp_path):
    model_dir = tmp_path / "model"
    _ok(_train(model_dir, "--epochs=2"))
    newest = model_dir / "checkpoints" / "epoch-0002-step-000022" / checkpoint.VARIABLES
    newest.write_bytes(newest.read_bytes()[:1000])   # as a full disk leaves it

    output = _ok(_train(model_dir, "--epochs=4", "--resume"))
    assert "epoch-0002-step-000022 is damaged" in output
    assert re.search(r"resuming from \S+epoch-0001-step-000022, after epoch 1, step 22 of 22",
                     output)
    assert _final_accuracy(output) > 0.9


def test_resuming_on_fewer_workers_rescales_the_learning_rate_and_the_steps(tmp_path):
    model_dir = tmp_path / "model"
    _ok(_train(model_dir, "--epochs=2", "--checkpoint_steps=10", "--warmup_epochs=1"))
    # Leave a checkpoint from the middle of the second epoch as the newest:
    # 22 steps an epoch at 2 x 32, so global step 40 is step 18 of epoch 2.
    names = _all_intact(model_dir)
    assert names[0] == "epoch-0002-step-000022"
    shutil.rmtree(model_dir / "checkpoints" / names[0])
    assert _all_intact(model_dir)[0] == "epoch-0002-step-000018"

    output = _ok(_train(model_dir, "--epochs=4", "--warmup_epochs=1", "--resume", np=1))
    # 18 steps x 2 workers x 32 = 1152 examples = step 36 of 44 for one worker.
    assert ("written by 2 workers x batch 32 after epoch 2, step 18 of 22; now 1 x 32: learning "
            "rate scaled for 1 workers, steps recomputed, going on after epoch 2, step 36 of 44"
            ) in output
    assert _final_accuracy(output) > 0.9
    restored = keras.saving.load_model(model_dir / "model.keras")
    assert float(restored.optimizer.learning_rate) == pytest.approx(0.02)   # one worker's


def test_exports_give_the_trained_models_predictions(tmp_path):
    model_dir = tmp_path / "model"
    output = _ok(_train(model_dir, "--epochs=1", "--best_metric=val_accuracy"))
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
    assert found.metric == pytest.approx(_final_accuracy(output), abs=1e-4)


def test_a_fresh_run_refuses_to_mix_with_an_earlier_runs_checkpoints(tmp_path):
    model_dir = tmp_path / "model"
    _ok(_train(model_dir, "--epochs=1"))
    result = _train(model_dir, "--epochs=1")
    assert result.returncode != 0
    errors = {text for _, text in rank_lines(result.stderr) if "hvdtrain: error:" in text}
    assert errors == {f"hvdtrain: error: {model_dir / 'checkpoints'} holds checkpoints of an "
                      "earlier run; pass --resume to go on from them, or choose another "
                      "--model_dir (found by rank 0)"}


def test_mixed_precision_state_and_accumulated_gradients_are_checkpointed(tmp_path):
    model_dir, faults = tmp_path / "model", REPO / "tests" / "recipes" / "faults.py"
    flags = [f"--recipe={faults}", "--precision=mixed_float16", "--backward_passes_per_step=3",
             "--checkpoint_steps=7"]
    _ok(_train(model_dir, *flags, "--epochs=1"))
    names = json.loads((model_dir / "checkpoints" / "epoch-0001-step-000028" /
                        checkpoint.META).read_text())["names"]
    for name in ("loss_scale_optimizer/dynamic_scale", "loss_scale_optimizer/step_counter",
                 "loss_scale_optimizer/iteration", "hvd_passes"):
        assert any(n.endswith(name) for n in names), (name, names)
    assert sum("hvd_accumulated" in n for n in names) == 4   # one per weight, mid-accumulation
    output = _ok(_train(model_dir, *flags, "--epochs=2", "--resume"))
    assert re.search(r"resuming from \S+epoch-0001-step-0000(\d\d), after epoch 1, "
                     r"step \1 of \1\b", output)
    assert _final_accuracy(output) > 0.9
