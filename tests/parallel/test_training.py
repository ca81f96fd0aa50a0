"""Data-parallel training at np=2, checked on what the ranks wrote."""

import json
import os

import numpy as np
import pytest

from launch import horovodrun, run, worker


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_ranks_end_with_bit_identical_weights(tmp_path, controller):
    _ok(horovodrun([*worker("train_and_dump"), tmp_path, tmp_path / "model"],
                   controller=controller))
    rank0, rank1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    assert rank0.files == rank1.files and len(rank0.files) > 10
    # The weights' moving average (--ema_momentum) too.
    assert any(name.endswith("_average") for name in rank0.files)
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    # The same averaged metrics on both ranks; the learning rate warmed up
    # (2 epochs) from one worker's 0.02 to 2 x 0.02, reaching 0.03 after one.
    history0 = json.loads((tmp_path / "rank0.json").read_text())
    assert history0 == json.loads((tmp_path / "rank1.json").read_text())
    assert history0["learning_rate"] == pytest.approx([0.03, 0.04])
    # Only rank 0 wrote the checkpoints, the final model and the logs (and
    # held the directory's lock).
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "checkpoints", "log.jsonl", "model.keras", "run.lock", "saved_model", "tensorboard"]


def test_step_at_np2_equals_step_at_np1_with_global_batch(tmp_path, controller):
    _ok(horovodrun([*worker("one_step"), tmp_path / "np2.npz", 16], controller=controller))
    _ok(run([*worker("one_step"), tmp_path / "np1.npz", 16]))
    np1, np2 = np.load(tmp_path / "np1.npz"), np.load(tmp_path / "np2.npz")
    half = len(np1.files) // 2
    initial = [np1[f"arr_{i}"] for i in range(half)]
    after_np1 = [np1[f"arr_{i + half}"] for i in range(half)]
    after_np2 = [np2[f"arr_{i + half}"] for i in range(half)]
    for init, a, b in zip(initial, after_np1, after_np2):
        assert not np.allclose(init, a), "the step changed nothing"
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _read_shards(tmp_path, examples, batch_size, intra_op_threads=0):
    _ok(horovodrun([*worker("shards"), tmp_path, examples, batch_size, intra_op_threads]))
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_shards_are_disjoint_and_cover_the_training_set(tmp_path):
    rank0, rank1 = _read_shards(tmp_path, examples=1000, batch_size=16)
    assert not set(rank0["read"]) & set(rank1["read"])
    read = set(rank0["read"]) | set(rank1["read"])
    assert len(rank0["read"]) == len(rank1["read"]) == 31 * 16
    # The documented remainder: what no rank reads, here 2 x (500 - 31 x 16).
    assert rank0["dropped"] == rank1["dropped"] == 1000 - len(read) == 8
    assert read <= set(range(1000))
    # Two processes on this host share its cores.
    cores = len(os.sched_getaffinity(0))
    assert rank0["intra_op_threads"] == rank1["intra_op_threads"] == max(1, cores // 2)


def test_uneven_data_gives_every_rank_the_same_steps(tmp_path):
    # 1,001 examples: shards of 501 and 500, i.e. 3 and 2 batches of 167.
    rank0, rank1 = _read_shards(tmp_path, examples=1001, batch_size=167, intra_op_threads=3)
    assert rank0["steps"] == rank1["steps"] == 2
    assert rank0["fit_steps"] == rank1["fit_steps"] == 2 * 2  # two epochs
    assert len(rank0["read"]) == len(rank1["read"]) == 2 * 167
    assert rank0["dropped"] == 1001 - 2 * 2 * 167
    assert rank0["intra_op_threads"] == rank1["intra_op_threads"] == 3  # the user's choice


def test_initial_state_is_broadcast_from_rank_0(tmp_path, controller):
    _ok(horovodrun([*worker("broadcast"), tmp_path], controller=controller))
    rank0, rank1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    names = [n.removeprefix("before:") for n in rank0.files if n.startswith("before:")]
    assert any("adam" in n for n in names) and any("kernel" in n for n in names)
    assert any(n.endswith("_average") for n in names)
    for name in names:
        assert not np.array_equal(rank0[f"before:{name}"], rank1[f"before:{name}"]), name
        np.testing.assert_array_equal(rank1[f"after:{name}"], rank0[f"before:{name}"], err_msg=name)
        np.testing.assert_array_equal(rank0[f"after:{name}"], rank0[f"before:{name}"], err_msg=name)
