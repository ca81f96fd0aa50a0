"""Learning-rate callbacks and metric averaging in one process (size 1)."""

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain import callbacks


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


def test_schedule_with_constant_multiplier_is_staircase():
    seen, history = _fit_recording_lr(callbacks.LearningRateScheduleCallback(
        initial_lr=0.4, multiplier=0.5, start_epoch=1))
    assert seen == pytest.approx([0.1] * 4 + [0.2] * 4)
    assert history["learning_rate"] == pytest.approx([0.1, 0.2])


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
