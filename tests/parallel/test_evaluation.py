"""Distributed evaluation equals a single-process evaluation of the whole split."""

import json

import pytest

from launch import horovodrun, run, worker


@pytest.mark.parametrize("examples", [101, 96])
def test_uneven_split_evaluates_exactly(tmp_path, examples):
    # 101: shards of 51 and 50 examples, 7 batches each, the last ones short.
    result = horovodrun([*worker("evaluate"), tmp_path / "np2.json", examples])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = run([*worker("evaluate"), tmp_path / "np1.json", examples])
    assert result.returncode == 0, result.stderr[-3000:]
    np2 = json.loads((tmp_path / "np2.json").read_text())["results"]
    np1 = json.loads((tmp_path / "np1.json").read_text())["results"]
    assert set(np2) == set(np1) == {"loss", "accuracy", "sparse_top_k_categorical_accuracy"}
    for name in np1:
        assert np2[name] == pytest.approx(np1[name], rel=1e-6), name
