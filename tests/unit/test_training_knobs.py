"""The Keras training knobs in one process: the moving average of the
weights (its start, its exact swap for validation, its finalizing once per
run), early stopping and the plateau schedule (their decisions, and the
state that checkpoints keep), the profiler's window, and XLA's refusals."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

import hvdtrain
from hvdtrain import callbacks, lr_schedules
from hvdtrain.data import from_arrays
from hvdtrain.errors import UsageError
from hvdtrain.parallel.data_parallel import optimizer as optimizer_lib
from hvdtrain.parallel.data_parallel.learning_rate_in_step import StepRate
from hvdtrain.run import fit
from hvdtrain.run.learning_rate import TrainingRate


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def _model(optimizer, metrics=()):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", metrics=list(metrics))
    return model


def _data(examples=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 3)).astype("float32")
    return x, np.sin(x.sum(axis=1, keepdims=True))


def test_accumulating_the_moving_average_starts_at_the_weights_not_at_zero():
    # Keras starts it at zero and takes the weights at iterations == 0; the
    # first update of 2 accumulated batches comes at iterations == 1.
    model = _model(hvdtrain.DistributedOptimizer(
        keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.9), backward_passes_per_step=2,
        average_aggregated_gradients=True))
    initial = [w.numpy() for w in model.trainable_weights]
    x, y = _data(4)
    # fit finalizes: the weights become the averages.
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    averages = [w.numpy() for w in model.trainable_weights]
    trained = _model(keras.optimizers.SGD(0.1))
    trained.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    for start, after, average in zip(initial, trained.get_weights(), averages):
        np.testing.assert_allclose(average, 0.9 * start + 0.1 * after, rtol=1e-5, atol=1e-7)


def test_validation_takes_the_moving_average_and_gives_the_weights_back_bit_for_bit():
    model = _model(keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.5))
    x, y = _data()
    for _ in range(4):   # steps without fit's end, which would write the averages in
        model.train_on_batch(x, y)
    optimizer = model.optimizer
    weights = [w.numpy() for w in model.trainable_weights]
    averages = [a.numpy() for a in optimizer._model_variables_moving_average]
    assert not np.allclose(weights[0], averages[0])
    seen = []

    class Look(keras.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            seen.append([w.numpy() for w in self.model.trainable_weights])

    swap = callbacks.AverageWeightsForEvaluation()
    for _ in range(3):
        model.evaluate(x, y, verbose=0, callbacks=[swap, Look()])
    for during in seen:
        for a, b in zip(during, averages):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(model.trainable_weights, weights):
        np.testing.assert_array_equal(a.numpy(), b)
    for a, b in zip(optimizer._model_variables_moving_average, averages):
        np.testing.assert_array_equal(a.numpy(), b)


def test_a_run_of_several_fits_keeps_the_weights_as_trained_until_its_end():
    model = _model(keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5))
    x, y = _data()
    data = from_arrays((x, y), 8, training=True)
    # Resumed after step 2 of 4: two fits, the rest of epoch 0, then epoch 1.
    fit.from_position(model, data, None, [], epochs=2, epoch=0, step=2, verbose=0)
    weights = [w.numpy() for w in model.trainable_weights]
    averages = [a.numpy() for a in model.optimizer._model_variables_moving_average]
    assert not np.allclose(weights[0], averages[0])
    model.optimizer.finalize_variable_values(model.trainable_weights)   # the trainer, at the end
    for a, b in zip(model.trainable_weights, averages):
        np.testing.assert_array_equal(a.numpy(), b)


def _fit_watching(callback, values, fits, model=None):
    """Fits epochs whose logged `watched` is values[epoch], one batch each;
    `fits`: (initial_epoch, epochs) of each fit call. Returns the epochs
    trained and the learning rate of each."""
    model = model or _model(keras.optimizers.SGD(0.01))
    trained, rates = [], []

    class Watched(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):   # the rate the step took
            rates.append(float(self.model.optimizer.learning_rate))

        def on_epoch_end(self, epoch, logs=None):
            logs["watched"] = values[epoch]
            trained.append(epoch + 1)

    x, y = _data(8)
    for initial, epochs in fits:
        model.fit(x, y, batch_size=8, epochs=epochs or len(values), initial_epoch=initial,
                  verbose=0, callbacks=[Watched(), callback])
    return trained, rates


def test_early_stopping_counts_across_fits_and_its_state_restores_the_count():
    values = [5.0, 4.0, 4.5, 4.6, 4.7, 1.0]
    stopping = callbacks.EarlyStopping("watched", patience=2, mode="min")
    # A run resumed mid-epoch fits twice: the count goes on from the first into the second.
    trained, _ = _fit_watching(stopping, values, fits=((0, 3), (3, None)))
    assert trained == [1, 2, 3, 4]
    state = json.loads(json.dumps(stopping.get_state()))   # as a checkpoint keeps it
    assert state == {"wait": 2, "best": 4.0, "best_epoch": 1, "stopped_epoch": 3}
    assert callbacks.EarlyStopping.stopped_after({"early_stopping": state}) == 4
    assert callbacks.EarlyStopping.stopped_after({}) is None
    # Resumed after epoch 3 with that epoch's state: it stops after epoch 4 again.
    resumed = callbacks.EarlyStopping("watched", patience=2, mode="min",
                                      state=dict(state, wait=1, stopped_epoch=0))
    assert _fit_watching(resumed, values, fits=((3, None),))[0] == [4]


def _model_with_a_plateau(values, batch=0, metrics=()):
    """A model whose train step sets a rate of 0.4 (one batch an epoch, one
    epoch of warm-up) lowered by a plateau, from the run's batch `batch`."""
    optimizer = hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.01))
    rate = TrainingRate(0.4, len(values), 1, lr_schedules.PLATEAU)
    rate.start(steps_per_epoch=1, replicas=1)
    optimizer_lib.set_step_rate(optimizer, StepRate(rate))
    optimizer_lib.step_rate(optimizer).stand_at(batch)
    return _model(optimizer, metrics)


def test_the_plateau_lowers_the_rate_after_warmup_and_keeps_its_count():
    values = [9.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5]
    plateau = callbacks.PlateauLearningRate("watched", factor=0.5, patience=2, warmup_epochs=1,
                                            mode="min")
    _, rates = _fit_watching(plateau, values, fits=((0, None),),
                             model=_model_with_a_plateau(values))
    # Epoch 1 is warm-up (its 9.0 not counted); best 1.0 in epoch 2, lowered
    # after epoch 4, best 0.5 in epoch 5, lowered after epoch 7.
    assert rates == pytest.approx([0.4, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2])
    assert plateau.get_state() == {"lowerings": 2, "wait": 0, "best": 0.5,
                                   "cooldown_counter": 0}
    # Resumed after epoch 6 with that epoch's state: lowered once, waiting one.
    resumed = callbacks.PlateauLearningRate(
        "watched", 0.5, 2, 1, mode="min", state={"lowerings": 1, "wait": 1, "best": 0.5,
                                                 "cooldown_counter": 0})
    _, rates = _fit_watching(resumed, values, fits=((6, None),),
                             model=_model_with_a_plateau(values, batch=6))
    assert rates == pytest.approx([0.2]) and resumed.get_state()["lowerings"] == 2


def test_the_profiler_records_its_window_of_steps_only(tmp_path):
    model = _model(keras.optimizers.SGD(0.01))
    probes = []

    class Probe(keras.callbacks.Callback):
        """The profiler can be started (it is not running) outside the window."""

        def on_train_batch_end(self, batch, logs=None):
            step = len(probes) + 1
            if step in (1, 5, 8):
                tf.profiler.experimental.start(str(tmp_path / "probe"))
                tf.profiler.experimental.stop(save=False)
            probes.append(step)

    x, y = _data(16)
    window = callbacks.ProfilerWindow(tmp_path / "train", first=2, last=4)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[window, Probe()])
    traces = list((tmp_path / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1
    space = xplane_pb2.XSpace()
    space.ParseFromString(traces[0].read_bytes())
    steps = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        stats = {k: v.name for k, v in plane.stat_metadata.items()}
        steps += [s.int64_value for line in plane.lines for event in line.events
                  if names.get(event.metadata_id) == "train"
                  for s in event.stats if stats[s.metadata_id] == "step_num"]
    assert sorted(steps) == [2, 3, 4]
    # TensorBoard's profile tab reads it: its converter's overview of the steps.
    overview = subprocess.run(
        [sys.executable, "-c", "import sys; from xprof.convert import raw_to_tool_data as r; "
         "print(r.xspace_to_tool_data([sys.argv[1]], 'overview_page', {})[0].decode())",
         str(traces[0])], capture_output=True, text=True, timeout=120)
    assert overview.returncode == 0, overview.stderr[-2000:]
    tables = json.loads(overview.stdout)
    step_table = next(t for t in tables if any(c["id"] == "stepnum" for c in t.get("cols", [])))
    steps = sorted(row["c"][0]["v"] for row in step_table["rows"])
    assert steps == ["train 2", "train 3", "train 4"]


def test_jit_compile_needs_a_model_compiled_without_xla():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(UsageError, match="compile the model first"):
        hvdtrain.jit_compile(model)
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with pytest.raises(UsageError, match="compile the model with jit_compile=False"):
        hvdtrain.jit_compile(model)


def test_a_watched_validation_metric_needs_validation_data():
    from hvdtrain.config import TrainConfig
    from hvdtrain.run import trainer

    config = TrainConfig(recipe="resnet50_synthetic", early_stopping_patience=2)
    with pytest.raises(UsageError, match="--best_metric=val_loss is a validation metric, and "
                                         "recipe resnet50_synthetic has no validation data: "
                                         r"watch a training metric \(e.g. --best_metric=loss\)"):
        trainer._check_watched_metric(config, None)
    trainer._check_watched_metric(config.override(best_metric="loss"), None)
    trainer._check_watched_metric(config, object())


def test_a_window_of_steps_past_the_runs_end_is_refused():
    from hvdtrain.config import TrainConfig
    from hvdtrain.run import trainer

    config = TrainConfig(epochs=2, profile_steps="41:45")
    with pytest.raises(UsageError, match=r"--profile_steps=41:45 starts after the run's last "
                                         r"step, 40 \(2 epochs of 20\): choose steps up to 40"):
        trainer._check_step_windows(config, steps=20, done=0)
    trainer._check_step_windows(config.override(profile_steps="40:45"), steps=20, done=0)
    with pytest.raises(UsageError, match="--timeline_steps=50:60 starts after"):
        trainer._check_step_windows(config.override(timeline_steps="50:60", profile_steps=""),
                                    steps=20, done=0)


@pytest.mark.parametrize("make", [
    lambda: callbacks.EarlyStopping("val_acc", patience=2),
    lambda: callbacks.PlateauLearningRate("val_acc", 0.5, 2, 0)])
def test_a_watched_metric_the_run_does_not_have_stops_it_naming_those_it_has(make):
    model = _model_with_a_plateau([0.0] * 2, metrics=["mae"])
    x, y = _data(8)
    with pytest.raises(UsageError, match="--best_metric=val_acc is not a metric of this run; it "
                                         "has loss, mae, val_loss, val_mae"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y),
                  callbacks=[make()])


def test_the_plateau_needs_the_rate_set_in_the_step():
    model = _model(keras.optimizers.SGD(0.01))
    x, y = _data(8)
    with pytest.raises(UsageError, match="use keras.callbacks.ReduceLROnPlateau"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
            callbacks.PlateauLearningRate("loss", factor=0.5, patience=2, warmup_epochs=0)])
