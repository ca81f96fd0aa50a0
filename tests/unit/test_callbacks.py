"""Learning-rate callbacks and metric averaging in one process (size 1), by
Horovod's names (hvdtrain.keras.callbacks over hvdtrain.callbacks), and the
momentum correction of both ways to set the rate: those callbacks between
steps, hvdtrain train's inside the step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
import momentum_reference
from hvdtrain.errors import UsageError
from hvdtrain.keras import callbacks
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib
from hvdtrain.parallel.data_parallel.learning_rate_in_step import StepRate


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def _fit_recording_lr(callback, epochs=2, steps=4):
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate))

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.ones((steps * 2, 1), "float32")
    history = model.fit(x, x, batch_size=2, epochs=epochs, verbose=0,
                        callbacks=[callback, Record()])
    return seen, history.history


def test_staircase_schedule_with_constant_multiplier_decays_exponentially():
    # Horovod 0.28: multiplier ** (epoch - start_epoch), from start_epoch on.
    seen, history = _fit_recording_lr(callbacks.LearningRateScheduleCallback(
        initial_lr=0.4, multiplier=0.5, start_epoch=1), epochs=3)
    assert seen == pytest.approx([0.1] * 4 + [0.4] * 4 + [0.2] * 4)
    assert history["learning_rate"] == pytest.approx([0.1, 0.4, 0.2])


def test_smooth_schedule_with_constant_multiplier_decays_every_batch():
    seen, _ = _fit_recording_lr(callbacks.LearningRateScheduleCallback(
        initial_lr=0.4, multiplier=0.5, staircase=False))
    assert seen == pytest.approx([0.4 * 0.5 ** (i / 4) for i in range(8)])


def test_staircase_schedule_with_a_function_changes_per_epoch_until_end_epoch():
    seen, _ = _fit_recording_lr(callbacks.LearningRateScheduleCallback(
        initial_lr=1.0, multiplier=lambda epoch: 0.5 + epoch, end_epoch=2), epochs=3)
    assert seen == pytest.approx([0.5] * 4 + [1.5] * 8)


def test_smooth_schedule_changes_every_batch():
    seen, _ = _fit_recording_lr(callbacks.LearningRateScheduleCallback(
        initial_lr=1.0, multiplier=lambda epoch: epoch, staircase=False))
    assert seen == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75])


def test_warmup_at_one_worker_keeps_the_rate():
    seen, _ = _fit_recording_lr(callbacks.LearningRateWarmupCallback(0.3, warmup_epochs=1))
    assert seen == pytest.approx([0.3] * 8)


def test_metric_average_at_one_worker_keeps_the_values():
    logs = {"loss": 0.5, "accuracy": 0.75, "note": "text"}
    callbacks.MetricAverageCallback().on_epoch_end(0, logs)
    assert logs == {"loss": 0.5, "accuracy": 0.75, "note": "text"}


# Momentum correction: least squares, one Dense(1) layer, 2 epochs of 3
# batches; the rate grows every batch, so every step but the first is corrected.

STEPS, BATCH, EPOCHS, LR = 3, 4, 2, 0.05


def _problem():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype("float32")
    return x, y


def _schedule(momentum_correction=True):
    return callbacks.LearningRateScheduleCallback(
        LR, lambda epoch: 1 + epoch, staircase=False, momentum_correction=momentum_correction)


def _fit(optimizer, setter, passes=1, momentum_correction=True):
    """Trains with the rate LR x (1 + the fractional epoch), set between
    steps by Horovod's callback (`setter` "callback") or in the train step
    (hvdtrain train's way, "step")."""
    x, y = _problem()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    initial = [np.asarray(w, np.float64) for w in model.get_weights()]
    fit_callbacks = []
    if setter == "callback":
        fit_callbacks.append(_schedule(momentum_correction))
    else:
        if not optimizer_lib.is_distributed(optimizer):
            optimizer = hvdtrain.DistributedOptimizer(optimizer)
        steps = STEPS * passes
        optimizer_lib.set_step_rate(optimizer, StepRate(
            lambda batch: LR * (1 + tf.cast(batch, tf.float64) / steps), momentum_correction))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH // passes, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=fit_callbacks)
    return initial, model.get_weights()


def _reference(initial, rule="sgd", corrected=True, momentum=0.9):
    x, y = _problem()
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)] * EPOCHS
    lrs = [LR * (1 + step / STEPS) for step in range(STEPS * EPOCHS)]
    return momentum_reference.train(*initial, batches, lrs, LR, momentum, rule, corrected)


def _assert_weights(actual, expected):
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# Horovod's callback and hvdtrain train's rate set in the step correct alike.
by_either = pytest.mark.parametrize("setter", ["callback", "step"])


@by_either
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_correction_matches_sgd_with_corrected_momentum(setter, nesterov):
    initial, weights = _fit(keras.optimizers.SGD(LR, momentum=0.9, nesterov=nesterov), setter)
    rule = "nesterov" if nesterov else "sgd"
    _assert_weights(weights, _reference(initial, rule))
    # The correction matters at this tolerance.
    assert not np.allclose(weights[0], _reference(initial, rule, corrected=False)[0],
                           rtol=1e-4, atol=1e-5)


@by_either
def test_momentum_correction_can_be_turned_off(setter):
    initial, weights = _fit(keras.optimizers.SGD(LR, momentum=0.9), setter,
                            momentum_correction=False)
    _assert_weights(weights, _reference(initial, corrected=False))


@by_either
def test_momentum_correction_of_rmsprop(setter):
    initial, weights = _fit(keras.optimizers.RMSprop(LR, momentum=0.9), setter)
    _assert_weights(weights, _reference(initial, "rmsprop"))


@by_either
@pytest.mark.parametrize("wrap", ["distributed", "loss_scale", "distributed_loss_scale"])
def test_momentum_correction_through_wrappers(setter, wrap):
    optimizer = keras.optimizers.SGD(LR, momentum=0.9)
    if "loss_scale" in wrap:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    if "distributed" in wrap:
        optimizer = hvdtrain.DistributedOptimizer(optimizer)
    initial, weights = _fit(optimizer, setter)
    _assert_weights(weights, _reference(initial))


@by_either
def test_momentum_correction_with_accumulated_gradients_uses_the_applying_batch(setter):
    # Two half batches per update; as in Horovod, the momentum of an update is
    # scaled by the ratio of its last batch's rate to the batch before's.
    optimizer = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9),
                                              backward_passes_per_step=2,
                                              average_aggregated_gradients=True)
    initial, weights = _fit(optimizer, setter, passes=2)
    x, y = _problem()
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)] * EPOCHS
    batch_lrs = [LR * (1 + e + k / (2 * STEPS)) for e in range(EPOCHS) for k in range(2 * STEPS)]
    expected = momentum_reference.train(*initial, batches, batch_lrs[1::2], LR, 0.9,
                                        previous_lrs=batch_lrs[0::2])
    _assert_weights(weights, expected)


@pytest.mark.parametrize("optimizer", [
    lambda: keras.optimizers.SGD(LR),
    lambda: keras.optimizers.Adam(LR),
], ids=["sgd_without_momentum", "adam"])
@by_either
def test_momentum_correction_leaves_other_optimizers_alone(setter, optimizer):
    _, corrected = _fit(optimizer(), setter)
    _, uncorrected = _fit(optimizer(), setter, momentum_correction=False)
    for a, b in zip(corrected, uncorrected):
        np.testing.assert_array_equal(a, b)


def test_policy_set_after_wrapping_is_refused():
    optimizer = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(UsageError,
                       match="set the mixed_float16 policy before DistributedOptimizer"):
        model.fit(np.ones((2, 2)), np.ones((2, 1)), verbose=0,
                  callbacks=[callbacks.BroadcastGlobalVariablesCallback(0)])
