"""Learning-rate callbacks at np=2: Horovod's warm-up formula per batch and
schedules, with momentum correction, against a numpy reference."""

import numpy as np
import pytest

import momentum_reference
from ranked.support import gathered
from workers import lr_schedules

# As in workers/lr_schedules.py.
STEPS, GLOBAL_BATCH, EPOCHS, LR, SIZE, WEIGHT_DECAY = 3, 8, 3, 0.05, 2, 0.5

pytestmark = pytest.mark.launches(controllers=("gloo",))


def _global_batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3
    return [(x[i:i + GLOBAL_BATCH], y[i:i + GLOBAL_BATCH])
            for i in range(0, len(x), GLOBAL_BATCH)] * EPOCHS


@pytest.fixture(scope="module")
def runs():
    return {name: gathered(lr_schedules.run(name))
            for name in ("warmup", "fractional_warmup", "decay", "warmup_nesterov_decay",
                         "warmup_rmsprop_decay")}


def _check_training(ranks, lrs, rule, weight_decay=0.0):
    rank0, rank1 = ranks
    for key in ("lrs", "w", "b"):
        np.testing.assert_array_equal(rank0[key], rank1[key], err_msg=key)
    np.testing.assert_allclose(rank0["lrs"], lrs, rtol=1e-6)
    initial = (rank0["w0"], rank0["b0"])
    expected = momentum_reference.train(*initial, _global_batches(), lrs, LR, 0.9, rule,
                                        weight_decay=weight_decay)
    for actual, wanted in zip((rank0["w"], rank0["b"]), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
    uncorrected = momentum_reference.train(*initial, _global_batches(), lrs, LR, 0.9, rule,
                                           corrected=False, weight_decay=weight_decay)
    assert not np.allclose(rank0["w"], uncorrected[0], rtol=1e-4, atol=1e-5)
    if weight_decay:
        undecayed = momentum_reference.train(*initial, _global_batches(), lrs, LR, 0.9, rule)
        assert not np.allclose(rank0["w"], undecayed[0], rtol=1e-4, atol=1e-5)


def test_warmup_follows_horovods_formula_with_momentum_correction(runs):
    # lr = LR / size * ((epoch + (batch + 1) / steps) * (size - 1) / warmup + 1),
    # from LR / size + a step's worth to LR at the end of epoch 2; then LR.
    warmup = [LR / SIZE * ((e + (b + 1) / STEPS) * (SIZE - 1) / 2 + 1)
              for e in range(2) for b in range(STEPS)]
    assert warmup[-1] == pytest.approx(LR)
    _check_training(runs["warmup"], warmup + [LR] * STEPS, "sgd")


def test_a_fractional_warmup_holds_the_full_rate_from_where_it_ends(runs):
    # Warm-up ends at epoch 1.5, in the middle of the second epoch's 3 steps.
    warmup = [LR / SIZE * (min(e + (b + 1) / STEPS, 1.5) * (SIZE - 1) / 1.5 + 1)
              for e in range(2) for b in range(STEPS)]
    assert warmup[3:] == pytest.approx([LR * 17 / 18, LR, LR])
    _check_training(runs["fractional_warmup"], warmup + [LR] * STEPS, "sgd")


def test_staircase_decay_with_nesterov_momentum_correction(runs):
    _check_training(runs["decay"], [LR] * STEPS + [LR] * STEPS + [LR / 2] * STEPS, "nesterov")


def _warmup_rates():
    return [LR / SIZE * ((e + (b + 1) / STEPS) * (SIZE - 1) / 2 + 1)
            for e in range(2) for b in range(STEPS)] + [LR] * STEPS


@pytest.mark.parametrize("name, rule", [("warmup_nesterov_decay", "nesterov"),
                                        ("warmup_rmsprop_decay", "rmsprop")])
def test_warmup_corrects_the_momentum_of_every_optimizer_that_has_one_with_weight_decay(
        runs, name, rule):
    _check_training(runs[name], _warmup_rates(), rule, weight_decay=WEIGHT_DECAY)
