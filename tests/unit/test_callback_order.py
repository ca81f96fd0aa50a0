"""hvdtrain's callbacks: the one order they run in, the global step they
share, and the direction of a monitored metric."""

import types

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain import callbacks
from hvdtrain.callbacks import ORDER
from hvdtrain.callbacks.base import monitor_mode
from hvdtrain.config import TrainConfig
from hvdtrain.run import fit, trainer


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def _every_callback(tmp_path, lr_schedule):
    config = TrainConfig(warmup_epochs=1, lr_schedule=lr_schedule, timeline_steps="2:3",
                         profile_steps="2:3", checkpoint_steps=5, ema_momentum=0.99,
                         early_stopping_patience=2)
    # Both an elastic state and a stop vote: no run has both, but each has its place.
    elastic_state = types.SimpleNamespace(position=None)
    return trainer._callbacks(elastic_state, callbacks.StopVote(), config, tmp_path, steps=10,
                              validation_steps=2, start=(0, 0), resumed=False).ordered


@pytest.mark.parametrize("lr_schedule, left_out", [("cosine", [callbacks.PlateauLearningRate]),
                                                   ("plateau", [])])
def test_a_run_with_everything_on_has_every_callback_in_the_stated_order(tmp_path, lr_schedule,
                                                                         left_out):
    # The train step sets the rate; a plateau's decisions are a callback's.
    assert [type(c) for c in _every_callback(tmp_path, lr_schedule)] == [
        c for c in ORDER if c not in left_out]


def test_the_order_keeps_each_callback_where_its_reason_puts_it():
    def before(first, then):
        return ORDER.index(first) < ORDER.index(then)

    assert ORDER[0] is callbacks.Throughput
    for reader in (callbacks.FailOnNonFiniteLoss, callbacks.PeriodicCheckpoint,
                   callbacks.RunLog, callbacks.EpochTensorBoard, callbacks.EarlyStopping,
                   callbacks.PlateauLearningRate):
        assert before(callbacks.AverageMetrics, reader)
        assert before(callbacks.ExactEvaluation, reader)
    # A checkpoint keeps the state of the decisions made at the same epoch's end.
    for decision in (callbacks.EarlyStopping, callbacks.PlateauLearningRate):
        assert before(decision, callbacks.PeriodicCheckpoint)
        assert before(decision, callbacks.TrackPosition)
    for reader in (callbacks.RunLog, callbacks.EpochTensorBoard):
        assert before(callbacks.LearningRateLog, reader)
    assert before(callbacks.PeriodicCheckpoint, callbacks.CommitState)
    # A stop at an epoch's end comes after that epoch's checkpoint and records.
    for first in (callbacks.PeriodicCheckpoint, callbacks.RunLog, callbacks.EpochTensorBoard):
        assert before(first, callbacks.PreemptionStop)
    assert ORDER[-2:] == (callbacks.TrackPosition, callbacks.CommitState)


def test_a_callback_outside_the_order_is_refused():
    with pytest.raises(ValueError):
        callbacks.in_order([callbacks.Throughput(8), keras.callbacks.History()])


def test_the_global_step_counts_whole_epochs_also_in_a_continued_one():
    seen = []

    class Steps(callbacks.TrainingCallback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(self.global_step(batch))

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((12, 1), "float32")
    model.fit(x, x, batch_size=4, epochs=2, verbose=0,
              callbacks=[fit.EpochSteps(Steps(), 7)])
    assert seen == [8, 9, 10, 18, 19, 20]


def test_a_monitored_metric_is_better_in_the_direction_it_declares():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.SparseCategoricalCrossentropy(name="score")])
    model.fit(np.zeros((4, 2)), np.zeros(4), verbose=0)
    assert monitor_mode(model, "val_accuracy") == "max"
    assert monitor_mode(model, "val_score") == "min"   # by its name it would be "max"
    assert monitor_mode(model, "val_loss") == "min"
    # A name no metric has is judged by its words.
    assert monitor_mode(model, "val_error_rate") == "min"
    assert monitor_mode(model, "val_auc") == "max"
