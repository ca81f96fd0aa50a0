"""Mixed precision: the loss-scaling decision is the same on every rank."""

import numpy as np
import pytest

from ranked.support import gathered
from workers import loss_scale


@pytest.mark.timeout(120)
def test_overflow_on_one_rank_makes_every_rank_skip_the_step(controller):
    rank0, rank1 = gathered(loss_scale.run())
    np.testing.assert_array_equal(rank0["weights"], rank1["weights"])
    np.testing.assert_array_equal(rank0["scale"], rank1["scale"])
    weights, scale = rank0["weights"], rank0["scale"]
    assert len(weights) == 4
    # Step 1 overflowed on rank 1 only: both skipped it and halved the scale.
    np.testing.assert_array_equal(weights[1], weights[0])
    assert scale[1] == scale[0] / 2 and scale[2] == scale[3] == scale[1]
    assert not np.array_equal(weights[2], weights[1])
    assert not np.array_equal(weights[3], weights[2])
    assert str(rank0["optimizer"]) == "LossScaleOptimizer"
    assert str(rank0["output_dtype"]) == "float32"
    assert list(rank0["variable_dtypes"]) == ["float32"]
