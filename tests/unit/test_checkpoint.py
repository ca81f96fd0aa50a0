"""The checkpoint format: whole or skipped, kept by recency and metric."""

import json

import keras
import numpy as np
import pytest

from hvdtrain.callbacks.base import monitor_mode
from hvdtrain.errors import UsageError
from hvdtrain.run import fit
from hvdtrain.state import atomic_files, checkpoint, training_state
from hvdtrain.state.training_state import Position


def _position(epoch, step=0, steps=10, workers=2, batch_size=4):
    return Position(epoch, step, steps, workers, batch_size)


def _save(directory, epoch, step=0, metric=None, seed=0):
    values = [np.random.default_rng(seed).normal(size=(3, 2)).astype("float32"),
              np.arange(4, dtype="int64")]
    checkpoint.save(directory, values, _position(epoch, step), {"recipe": "r"}, metric)
    return values


def test_save_then_read_gives_the_same_values_and_position(tmp_path):
    values = _save(tmp_path, 2, 5, metric=0.25)
    found, read = checkpoint.read(tmp_path / "epoch-0003-step-000005")
    assert found.position == _position(2, 5) and found.metric == 0.25
    assert found.settings == {"recipe": "r"}
    for a, b in zip(values, read):
        np.testing.assert_array_equal(a, b)
    assert [p.name for p in tmp_path.iterdir()] == ["epoch-0003-step-000005"]
    assert found.callbacks == {}


def test_the_state_of_callbacks_is_kept_with_the_variables(tmp_path):
    states = {"early_stopping": {"wait": 2, "best": 0.5, "best_epoch": 3, "stopped_epoch": 0}}
    checkpoint.save(tmp_path, [np.zeros(2)], _position(1), {}, callbacks=states)
    found, _ = checkpoint.read(tmp_path / "epoch-0001-step-000010")
    assert found.callbacks == states


@pytest.mark.parametrize("epoch, step, shown", [
    (0, 0, "epoch 1, step 0 of 10"),    # the start
    (0, 3, "epoch 1, step 3 of 10"),
    (1, 0, "epoch 1, step 10 of 10"),   # the first epoch's end, as Keras's "Epoch 1/N" ends
    (1, 4, "epoch 2, step 4 of 10"),
])
def test_a_position_is_named_and_described_in_one_numbering(epoch, step, shown):
    position = _position(epoch, step)
    assert position.describe() == shown
    shown_epoch, shown_step = position.shown
    assert position.name == f"epoch-{shown_epoch:04d}-step-{shown_step:06d}"


def test_newest_is_by_position_not_by_name_order_of_digits(tmp_path):
    for epoch, step in [(9, 0), (10, 0), (10, 3), (2, 50)]:
        _save(tmp_path, epoch, step)
    assert [p.name for p in checkpoint.listed(tmp_path)] == [
        "epoch-0011-step-000003", "epoch-0010-step-000010", "epoch-0009-step-000010",
        "epoch-0003-step-000050"]


@pytest.mark.parametrize("damage", ["truncated variables", "flipped byte", "missing meta",
                                    "garbage meta", "missing variables"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, damage, caplog):
    _save(tmp_path, 1, seed=1)
    _save(tmp_path, 2, seed=2)
    newest = tmp_path / "epoch-0002-step-000010"
    variables, meta = newest / checkpoint.VARIABLES, newest / checkpoint.META
    if damage == "truncated variables":
        variables.write_bytes(variables.read_bytes()[:-100])
    elif damage == "flipped byte":
        data = bytearray(variables.read_bytes())
        data[len(data) // 2] ^= 0xFF
        variables.write_bytes(bytes(data))
    elif damage == "missing meta":
        meta.unlink()
    elif damage == "garbage meta":
        meta.write_text("{not json")
    else:
        variables.unlink()
    with pytest.raises(checkpoint.CorruptCheckpoint):
        checkpoint.read(newest)
    found, values = checkpoint.newest(tmp_path)
    assert found.position.epoch == 1
    np.testing.assert_array_equal(values[0], _save(tmp_path / "again", 1, seed=1)[0])
    assert "epoch-0002-step-000010 is damaged" in caplog.text


def test_unfinished_saves_are_invisible_and_removed(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / ".tmp-epoch-0002-step-000010.123").mkdir()
    assert [p.name for p in checkpoint.listed(tmp_path)] == ["epoch-0001-step-000010"]
    atomic_files.remove_unfinished(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["epoch-0001-step-000010"]


def test_retain_keeps_the_newest_and_the_best(tmp_path):
    for epoch, loss in [(1, 0.9), (2, 0.2), (3, 0.5), (4, 0.6), (5, float("nan"))]:
        _save(tmp_path, epoch, metric=loss)
    _save(tmp_path, 5, 4)   # a mid-epoch checkpoint has no metric
    checkpoint.retain(tmp_path, keep=2, mode="min")
    assert [p.name for p in checkpoint.listed(tmp_path)] == [
        "epoch-0006-step-000004", "epoch-0005-step-000010", "epoch-0002-step-000010"]


def test_metric_mode():
    # A model without metrics: the direction is judged by the name's words.
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    assert monitor_mode(model, "val_loss") == "min"
    assert monitor_mode(model, "val_accuracy") == "max"


def test_a_checkpoint_that_does_not_fit_the_state_is_refused(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    # As hvdtrain.state.whole_state.describe gives the state.
    described = [(v.path, tuple(v.shape), str(v.dtype)) for v in model.variables]
    values = [np.ones((2, 3), "float32"), np.ones(3, "float32")]
    found = checkpoint.Checkpoint(tmp_path, _position(1), None, {})
    checkpoint.check_fits(described, found, values)
    with pytest.raises(UsageError, match=r"does not fit this model: .*kernel has shape \(2, 3\)"):
        checkpoint.check_fits(described, found, [np.zeros((3, 3), "float32"), values[1]])
    with pytest.raises(UsageError, match="it holds 1 variables, the model and optimizer 2"):
        checkpoint.check_fits(described, found, values[:1])


@pytest.mark.parametrize("saved, now, expected", [
    (_position(3, 4), (10, 2, 4), (3, 4)),            # same run shape: the same batch
    (_position(3, 4), (20, 1, 4), (3, 8)),            # half the workers: twice the steps
    (_position(3, 6, steps=10), (5, 4, 4), (3, 3)),   # double the workers: half the steps
    (_position(3, 9), (4, 4, 4), (4, 0)),             # past this run's epoch: the next one
    (_position(3, 5), (5, 3, 4), (3, 3)),             # between steps: the earlier one
    (_position(3, 0), (7, 1, 8), (3, 0)),
])
def test_continue_at_counts_examples_when_the_run_shape_changes(saved, now, expected):
    steps, workers, batch_size = now
    assert training_state.continue_at(saved, steps, workers, batch_size) == expected


def test_continued_epoch_shows_callbacks_the_whole_epoch():
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(("epoch", epoch, self.params["steps"]))

        def on_train_batch_begin(self, batch, logs=None):
            seen.append(("batch", batch))

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((12, 1), "float32")
    model.fit(x, x, batch_size=4, epochs=3, initial_epoch=2, verbose=0,
              callbacks=[fit.EpochSteps(Recorder(), 7)])
    assert seen == [("epoch", 2, 10), ("batch", 7), ("batch", 8), ("batch", 9)]


def test_meta_is_readable_json(tmp_path):
    _save(tmp_path, 1, metric=0.5)
    meta = json.loads((tmp_path / "epoch-0001-step-000010" / checkpoint.META).read_text())
    assert meta["position"]["epoch"] == 1 and meta["shapes"] == [[3, 2], [4]]


@pytest.mark.parametrize("saved, now, message", [
    (dict(optimizer="adam"), dict(optimizer="sgd"), "was written with --optimizer=adam"),
    (dict(), dict(ema_momentum=0.99), "was written without --ema_momentum; resume the same way"),
    (dict(ema_momentum=0.9), dict(), "was written with --ema_momentum=0.9; resume the same way"),
])
def test_resuming_with_settings_that_shape_the_state_otherwise_is_refused(tmp_path, saved, now,
                                                                         message):
    import dataclasses

    from hvdtrain.config import TrainConfig

    checkpoint.save(tmp_path, [np.zeros(2)], _position(1), dataclasses.asdict(TrainConfig(**saved)))
    with pytest.raises(UsageError, match=message):
        checkpoint._load_newest(None, tmp_path, TrainConfig(**now))
