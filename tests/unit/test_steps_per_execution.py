"""Several training steps per call of the train function (run/executions.py)
in one process: each epoch's last call cut at its end, the callbacks'
steps as one step per call numbers them, the same training as one step per
call, and what the callbacks do at a call's end."""

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain import callbacks
from hvdtrain.data import from_arrays
from hvdtrain.errors import TrainingError
from hvdtrain.run import executions, fit

# 10 steps an epoch: calls of 4 steps end each epoch with one of 2.
STEPS, BATCH, EPOCHS = 10, 4, 3


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def _data(poisoned=False):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype("float32")
    if poisoned:
        x[:] = np.nan
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype("float32")
    return from_arrays((x, y), BATCH, training=True, seed=1)


def _model(steps_per_execution):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(1)])
    model.compile(optimizer=hvdtrain.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    executions.Executions(model, steps_per_execution)
    return model


class _Steps(callbacks.TrainingCallback):
    """Each call's (epoch, first step, last step), as the callbacks see them."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append([self.epoch, batch])

    def on_train_batch_end(self, batch, logs=None):
        self.calls[-1].append(batch)


def _train(model, data, chosen=(), epoch=0, step=0):
    return fit.from_position(model, data, None, list(chosen), epochs=EPOCHS, epoch=epoch,
                             step=step, verbose=0)


def test_each_epochs_last_call_stops_at_the_epochs_end_and_trains_what_one_step_per_call_does():
    # The data's length is known: Keras, counting 4 steps for each cut call,
    # would end the last epoch early.
    data = _data()
    one, several = _model(1), _model(4)
    _train(one, data)
    seen = _Steps()
    _train(several, data, [seen])
    assert seen.calls == [[epoch, first, last] for epoch in range(EPOCHS)
                          for first, last in ((0, 3), (4, 7), (8, 9))]
    assert int(several.optimizer.iterations) == EPOCHS * STEPS
    for a, b in zip(one.get_weights(), several.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_continued_epoch_is_numbered_from_its_first_step():
    seen = _Steps()
    _train(_model(4), _data(), [seen], epoch=1, step=5)
    assert seen.calls[:3] == [[1, 5, 8], [1, 9, 9], [2, 0, 3]]


def test_periodic_checkpoints_fall_at_the_end_of_the_call_that_reaches_their_step(tmp_path):
    saver = callbacks.PeriodicCheckpoint(tmp_path, {}, BATCH, EPOCHS, every_epochs=0,
                                         every_steps=3, keep=10)
    _train(_model(4), _data(), [saver])
    names = sorted(p.name for p in tmp_path.iterdir())
    # Calls end at global steps 4 8 10 | 14 18 20 | 24 28 30; each but an
    # epoch's end that reaches a multiple of 3 (3 | 6 | 9) writes one.
    assert names == ["epoch-0001-step-000004", "epoch-0001-step-000008",
                     "epoch-0002-step-000004", "epoch-0002-step-000008",
                     "epoch-0003-step-000004", "epoch-0003-step-000008",
                     "epoch-0003-step-000010"]


def test_the_throughput_meter_counts_every_step_of_a_call():
    meter = callbacks.Throughput(BATCH, warmup_steps=4, window_steps=6)
    _train(_model(4), _data(), [meter])
    # Warm-up is the fit's first call; a window closes at the first call's
    # end that reaches 6 steps, and an epoch's end drops one left open.
    assert len(meter.samples) == EPOCHS
    assert len(meter.epoch_step_seconds) == STEPS   # the last epoch's, every step timed


def test_a_nan_in_a_call_names_its_steps():
    with pytest.raises(TrainingError, match=r"the loss is nan at epoch 1, steps 5-8 on rank 0"):
        _train(_model(4), _data(poisoned=True), [callbacks.FailOnNonFiniteLoss()], step=4)


def test_elastic_commits_count_steps_and_fall_at_a_calls_end():
    class State:
        position = None

        def __init__(self):
            self.committed = []

        def commit(self):
            self.committed.append((self.position.epoch, self.position.step))

    state = State()
    _train(_model(4), _data(), [callbacks.TrackPosition(state, BATCH),
                                callbacks.CommitState(state, batches_per_commit=6)])
    # Calls end at global steps 4 8 10 | 14 18 20 | 24 28 30: every 6 steps
    # counted across epochs, at the call that reaches them (8, 14, 20: an
    # epoch's end, which commits anyway; 28), and at each epoch's end.
    assert state.committed == [(0, 8), (1, 0), (1, 4), (2, 0), (2, 8), (3, 0)]
