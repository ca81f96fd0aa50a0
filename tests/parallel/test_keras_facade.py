"""The Horovod-style facade (hvdtrain.keras) at np=2."""

import json

import numpy as np

from launch import horovodrun, worker


def test_state_restored_on_rank_0_only_is_broadcast(tmp_path, controller):
    result = horovodrun([*worker("restored_adam"), tmp_path], controller=controller)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(i["distributed"] and i["optimizer"] == "Adam" for i in info)
    rank0, rank1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    count = len(info[0]["paths"])
    assert len(rank0.files) == len(rank1.files) == 3 * count
    values = [[npz[f"arr_{i}"] for i in range(3 * count)] for npz in (rank0, rank1)]
    (before0, broadcast0, after0), (before1, broadcast1, after1) = (
        [v[k * count:(k + 1) * count] for k in range(3)] for v in values)
    paths = info[0]["paths"]
    iteration = paths.index(next(p for p in paths if p.endswith("iteration")))
    assert before0[iteration] == 6 and before1[iteration] == 0  # 3 epochs of 2 steps
    slots = [i for i, p in enumerate(paths) if p.endswith(("_momentum", "_velocity"))]
    assert len(slots) == 8
    for i, path in enumerate(paths):
        if i in slots:
            assert np.any(before0[i] != 0) and not np.any(before1[i]), path
        # Rank 0's restored state everywhere, then the same step everywhere.
        np.testing.assert_array_equal(broadcast0[i], before0[i], err_msg=path)
        np.testing.assert_array_equal(broadcast1[i], before0[i], err_msg=path)
        np.testing.assert_array_equal(after0[i], after1[i], err_msg=path)
    assert after0[iteration] == 6 + 2
