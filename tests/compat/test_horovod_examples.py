"""Horovod's published Keras examples run on Keras 3 with hvdtrain.keras in
place of horovod.tensorflow.keras (see each script's header for its changes).
Own launches: the scripts run as users run them, under horovodrun."""

import json
import os
import pathlib

import numpy as np
import pytest

from launch import horovodrun, rank_lines

HERE = pathlib.Path(__file__).resolve().parent


def test_tensorflow2_keras_mnist(tmp_path):
    # No network: a start-up hook serves MNIST-shaped digits and dumps each
    # rank's final weights and history into tmp_path (fake_mnist/sitecustomize.py).
    path = os.pathsep.join(filter(None, [str(HERE / "fake_mnist"), os.environ.get("PYTHONPATH")]))
    result = horovodrun(["python", HERE / "tensorflow2_keras_mnist.py"], cwd=tmp_path,
                        env={"PYTHONPATH": path, "HVDTRAIN_DUMP_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Rank 0 alone reports progress and writes the checkpoints.
    printed = rank_lines(result.stdout)
    assert any("accuracy:" in text for rank, text in printed if rank == 0)
    assert not any("accuracy:" in text for rank, text in printed if rank == 1)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        f"checkpoint-{epoch}.h5" for epoch in range(1, 5)]
    # It learns; the ranks end identical, with the same averaged metrics.
    history = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert history[0] == history[1]
    assert history[0]["loss"][-1] < 0.5 * history[0]["loss"][0]
    assert history[0]["learning_rate"][-1] == pytest.approx(0.001 * 2)
    weights = [np.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    assert len(weights[0].files) == 8
    for name in weights[0].files:
        np.testing.assert_array_equal(weights[0][name], weights[1][name], err_msg=name)
