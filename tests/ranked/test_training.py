"""Data-parallel training at np=2, checked on what the ranks computed."""

import numpy as np
import pytest

from launch import run, worker
from ranked.support import computed_once, gathered
from run_checks import ok
from workers import broadcast, one_step, train_and_dump


def test_ranks_end_with_bit_identical_weights(shared_tmp_path, controller):
    (rank0, history0), (rank1, history1) = gathered(
        train_and_dump.run(shared_tmp_path, shared_tmp_path / "model"))
    assert list(rank0) == list(rank1) and len(rank0) > 10
    # The weights' moving average (--ema_momentum) too.
    assert any(name.endswith("_average") for name in rank0)
    for name in rank0:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    # The same averaged metrics on both ranks; the learning rate warmed up
    # (2 epochs) from one worker's 0.02 to 2 x 0.02, reaching 0.03 after one.
    assert history0 == history1
    assert history0["learning_rate"] == pytest.approx([0.03, 0.04])
    # Only rank 0 wrote the checkpoints, the final model and the logs (and
    # held the directory's lock).
    assert sorted(p.name for p in (shared_tmp_path / "model").iterdir()) == [
        "checkpoints", "log.jsonl", "model.keras", "run.lock", "saved_model", "tensorboard"]


def _single_process_step(out):
    ok(run([*worker("one_step"), out / "np1.npz", 16]))


def test_step_at_np2_equals_step_at_np1_with_global_batch(controller):
    _, after_np2 = gathered(one_step.step(16))[0]   # rank 0's, as it wrote them
    np1 = np.load(computed_once("training-one-step-np1", _single_process_step) / "np1.npz")
    half = len(np1.files) // 2
    initial = [np1[f"arr_{i}"] for i in range(half)]
    after_np1 = [np1[f"arr_{i + half}"] for i in range(half)]
    for init, a, b in zip(initial, after_np1, after_np2):
        assert not np.allclose(init, a), "the step changed nothing"
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_initial_state_is_broadcast_from_rank_0(controller):
    rank0, rank1 = gathered(broadcast.run())
    names = [n.removeprefix("before:") for n in rank0 if n.startswith("before:")]
    assert any("adam" in n for n in names) and any("kernel" in n for n in names)
    assert any(n.endswith("_average") for n in names)
    for name in names:
        assert not np.array_equal(rank0[f"before:{name}"], rank1[f"before:{name}"]), name
        np.testing.assert_array_equal(rank1[f"after:{name}"], rank0[f"before:{name}"], err_msg=name)
        np.testing.assert_array_equal(rank0[f"after:{name}"], rank0[f"before:{name}"], err_msg=name)
