"""The Horovod-style facade (hvdtrain.keras) at np=2."""

import numpy as np

from ranked.support import gathered
from workers import restored_adam


def test_state_restored_on_rank_0_only_is_broadcast(tmp_path, controller):
    (values0, info0), (values1, info1) = gathered(restored_adam.run(tmp_path))
    info = [info0, info1]
    assert all(i["distributed"] and i["optimizer"] == "Adam" for i in info)
    count = len(info[0]["paths"])
    assert len(values0) == len(values1) == 3 * count
    (before0, broadcast0, after0), (before1, broadcast1, after1) = (
        [v[k * count:(k + 1) * count] for k in range(3)] for v in (values0, values1))
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
