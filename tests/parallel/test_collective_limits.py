"""XLA compiles all of a train step but its collectives.

Own launches: the XLA compile count is read from TensorFlow's log
(TF_CPP_VMODULE), which must be set before TensorFlow starts."""

import re

import numpy as np

from launch import horovodrun, rank_lines, worker


def test_xla_compiles_all_but_the_collectives_and_changes_no_step(tmp_path):
    # Each compiled model is two XLA computations on each rank: its forward
    # and backward pass, and its optimizer's update.
    result = horovodrun([*worker("jit_compile"), "split", tmp_path],
                        env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "device_compiler=1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        compiled = [int(n) for r, text in rank_lines(result.stdout + result.stderr) if r == rank
                    for n in re.findall(r"Compilation of XLA executable .*#called: (\d+)", text)]
        assert max(compiled) == 2 * 3, rank
    rank0, rank1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
        pair, jit, index = name.split(":")
        if jit == "True":
            np.testing.assert_allclose(rank0[name], rank0[f"{pair}:False:{index}"], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
