import pytest

from hvdtrain import lr_schedules
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


def test_constant_keeps_the_scaled_rate():
    multiplier = lr_schedules.after_warmup("constant", epochs=8, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 5.5, 7.9)] == [1.0, 1.0, 1.0]


def test_step_divides_by_ten_at_half_and_three_quarters_of_whole_epochs():
    multiplier = lr_schedules.after_warmup("step", epochs=8, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 3.99, 4, 5.5, 6, 7.9)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])


def test_cosine_decays_from_the_end_of_warm_up_to_zero_at_the_last_epoch():
    multiplier = lr_schedules.after_warmup("cosine", epochs=10, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 6, 10)] == pytest.approx([1, 0.5, 0])


def test_an_unknown_schedule_names_the_ones_there_are():
    with pytest.raises(UsageError, match="unknown learning-rate schedule 'linear'; "
                                         "choose one of constant, cosine, step"):
        lr_schedules.after_warmup("linear", epochs=8, warmup_epochs=2)


@pytest.mark.parametrize("name", lr_schedules.AFTER_WARMUP)
def test_every_schedule_is_a_valid_setting(name):
    TrainConfig(lr_schedule=name).validate()


# hvdtrain train's rate, as the train step computes it (run/learning_rate.py).

def _rates(schedule, batches):
    import numpy as np
    return np.array([float(schedule(batch)) for batch in range(batches)])


def _training_rate(epochs, warmup_epochs, schedule, steps, replicas, learning_rate=1.0):
    from hvdtrain.run.learning_rate import TrainingRate
    rate = TrainingRate(learning_rate, epochs, warmup_epochs, schedule)
    rate.start(steps, replicas)
    return rate


def test_the_step_rate_decays_by_ten_after_warm_up_at_half_and_three_quarters():
    rate = _training_rate(epochs=4, warmup_epochs=1, schedule="step", steps=4, replicas=1)
    # At one replica warm-up keeps the rate; then 1, x0.1 at epoch 2, x0.01 at 3.
    assert list(_rates(rate, 16)) == pytest.approx([1.0] * 8 + [0.1] * 4 + [0.01] * 4)


def test_the_step_rate_decays_along_a_cosine_after_a_fractional_warm_up():
    import numpy as np
    rate = _training_rate(epochs=3, warmup_epochs=0.5, schedule="cosine", steps=4, replicas=1)
    expected = [0.5 * (1 + np.cos(np.pi * (1 + i / 4 - 0.5) / 2.5)) for i in range(8)]
    rates = _rates(rate, 12)
    assert list(rates) == pytest.approx([1.0] * 4 + expected, abs=1e-12)
    assert rates[-1] < 0.03 and all(a > b for a, b in zip(rates[4:], rates[5:]))


@pytest.mark.parametrize("name", [*lr_schedules.AFTER_WARMUP, lr_schedules.PLATEAU])
def test_the_step_rate_is_the_python_formulas_batch_by_batch(name):
    # Warm-up from one replica's rate while the epoch begun is below 1.5,
    # counting the batch being started; then the schedule of the epoch.
    steps, replicas, epochs, warmup_epochs, learning_rate = 5, 4, 6, 1.5, 0.1
    rate = _training_rate(epochs, warmup_epochs, name, steps, replicas, learning_rate)
    after = (lambda epoch: 1.0) if name == lr_schedules.PLATEAU else lr_schedules.after_warmup(
        name, epochs, warmup_epochs)
    expected = []
    for epoch in range(epochs):
        for batch in range(steps):
            fractional = epoch + batch / steps
            multiplier = (lr_schedules.warmup(fractional, warmup_epochs, replicas, steps)
                          if epoch < warmup_epochs else after(fractional))
            expected.append(learning_rate * replicas * multiplier)
    assert list(_rates(rate, epochs * steps)) == pytest.approx(expected, rel=1e-12)
    assert expected[0] == pytest.approx(learning_rate * (1 + 3 / steps / warmup_epochs))


def test_a_plateau_lowers_the_rate_after_warm_up_only():
    rate = _training_rate(epochs=4, warmup_epochs=1, schedule=lr_schedules.PLATEAU, steps=2,
                          replicas=2)
    rate.lower(0.1)
    assert list(_rates(rate, 4)) == pytest.approx([1.5, 2.0, 0.2, 0.2])
