import pytest

from hvdtrain import schedules
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


def test_constant_keeps_the_scaled_rate():
    multiplier = schedules.after_warmup("constant", epochs=8, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 5.5, 7.9)] == [1.0, 1.0, 1.0]


def test_step_divides_by_ten_at_half_and_three_quarters_of_whole_epochs():
    multiplier = schedules.after_warmup("step", epochs=8, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 3.99, 4, 5.5, 6, 7.9)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])


def test_cosine_decays_from_the_end_of_warm_up_to_zero_at_the_last_epoch():
    multiplier = schedules.after_warmup("cosine", epochs=10, warmup_epochs=2)
    assert [multiplier(epoch) for epoch in (2, 6, 10)] == pytest.approx([1, 0.5, 0])


def test_an_unknown_schedule_names_the_ones_there_are():
    with pytest.raises(UsageError, match="unknown learning-rate schedule 'linear'; "
                                         "choose one of constant, cosine, step"):
        schedules.after_warmup("linear", epochs=8, warmup_epochs=2)


@pytest.mark.parametrize("name", schedules.AFTER_WARMUP)
def test_every_schedule_is_a_valid_setting(name):
    TrainConfig(lr_schedule=name).validate()
