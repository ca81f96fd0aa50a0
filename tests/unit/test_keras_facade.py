"""hvdtrain.keras offers horovod.tensorflow.keras's names and signatures, and
its load_model and BestModelCheckpoint work, in one process (size 1)."""

import ast
import importlib.util
import inspect
import pathlib

import keras
import numpy as np
import pytest

import hvdtrain.keras as hvd
from hvdtrain.errors import UsageError
from hvdtrain.parallel.data_parallel.optimizer import is_distributed

# Read from the installed Horovod's source: importing its Keras module would
# load Keras 2-only code.
HOROVOD = pathlib.Path(importlib.util.find_spec("horovod").submodule_search_locations[0])


def _horovod_parameters(relative_path, name):
    """Parameter names of function `name`, or of class `name`'s __init__ (no self)."""
    tree = ast.parse((HOROVOD / relative_path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            node = next(n for n in node.body
                        if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        elif not (isinstance(node, ast.FunctionDef) and node.name == name):
            continue
        return [a.arg for a in node.args.args if a.arg != "self"]
    raise LookupError(name)


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


@pytest.mark.parametrize("name", [
    "DistributedOptimizer", "load_model", "allreduce", "allgather", "broadcast",
    "reducescatter", "init", "callbacks.BroadcastGlobalVariablesCallback",
    "callbacks.MetricAverageCallback", "callbacks.LearningRateScheduleCallback",
    "callbacks.LearningRateWarmupCallback", "callbacks.BestModelCheckpoint"])
def test_signatures_are_horovods(name):
    module, _, attr = name.rpartition(".")
    ours = getattr(hvd.callbacks if module else hvd, attr)
    source = ("tensorflow/keras/callbacks.py" if module
              else "common/basics.py" if name == "init"  # what horovod.tensorflow.init calls
              else "tensorflow/keras/__init__.py")
    theirs = _horovod_parameters(source, attr)
    mine = list(inspect.signature(ours).parameters)
    # Same names in the same places; only BestModelCheckpoint adds one at the end.
    assert mine[:len(theirs)] == theirs
    assert mine[len(theirs):] == (["filepath"] if attr == "BestModelCheckpoint" else [])


def _horovod_public_names(relative_path):
    """The names a module of the installed Horovod defines or re-exports,
    leaving out the modules and version helpers it imports for itself."""
    names = set()
    for node in ast.parse((HOROVOD / relative_path).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module != "horovod.common.util":
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_") and n not in {"keras", "tf", "version"}}


@pytest.mark.parametrize("module, relative_path", [
    ("", "tensorflow/keras/__init__.py"), ("callbacks", "tensorflow/keras/callbacks.py"),
    ("elastic", "tensorflow/keras/elastic.py")])
def test_every_public_name_of_horovods_keras_modules_is_here(module, relative_path):
    ours = getattr(hvd, module) if module else hvd
    theirs = _horovod_public_names(relative_path)
    assert len(theirs) > 3
    assert sorted(n for n in theirs if not hasattr(ours, n)) == []
    # And horovod.keras's PartialDistributedOptimizer, for Keras scripts.
    assert callable(hvd.PartialDistributedOptimizer)
    assert hvd.size() == 1 and hvd.rank() == 0 and hvd.local_rank() == 0


def test_broadcast_global_variables_names_the_keras_3_way():
    with pytest.raises(UsageError, match=r"hvd.broadcast_variables\(model.variables"):
        hvd.broadcast_global_variables(0)


def test_partial_distributed_optimizer_takes_layers_only():
    with pytest.raises(UsageError, match="local_layers must be keras layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["dense"])


def test_accumulation_advances_iterations_and_the_schedule_per_batch():
    # Horovod increments iterations at every apply_gradients call; Keras's
    # own gradient_accumulation_steps keys the schedule on the same count
    # (its `iterations` shows updates): the rate moves per batch.
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1, 3], [0.1, 0.05, 0.01])
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    weights, counts = [], []
    for optimizer in (hvd.DistributedOptimizer(keras.optimizers.SGD(schedule),
                                               backward_passes_per_step=2,
                                               average_aggregated_gradients=True),
                      keras.optimizers.SGD(schedule, gradient_accumulation_steps=2)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, x[:, :2], batch_size=2, epochs=1, shuffle=False, verbose=0)
        weights.append(model.get_weights())
        counts.append(int(optimizer.iterations))
    assert counts == [8, 8 // 2]
    for ours, keras_own in zip(*weights):
        np.testing.assert_allclose(ours, keras_own, rtol=1e-6)


def test_collectives_take_numpy_and_return_numpy_friendly_values():
    np.testing.assert_array_equal(np.asarray(hvd.allreduce(np.array([1.0, 3.0]))), [1.0, 3.0])
    np.testing.assert_array_equal(hvd.allgather([[1, 2]]).numpy(), [[1, 2]])
    assert float(hvd.broadcast(2.5, root_rank=0)) == 2.5
    with pytest.raises(UsageError, match="bf16"):
        hvd.allreduce([1.0], compression=hvd.Compression.bf16)


def _trained(tmp_path, optimizer, name="model.keras"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    model.fit(x, x[:, :2], batch_size=4, epochs=2, verbose=0)
    model.save(tmp_path / name)
    return model


def _assert_same_optimizer_state(loaded, saved):
    assert int(loaded.iterations) == int(saved.iterations) > 0
    # Iterations, rate, then the two Adam slots of kernel and bias (whose
    # names follow the layers', which differ after loading).
    assert len(loaded.variables) == len(saved.variables) == 6
    for restored, value in zip(loaded.variables, saved.variables):
        np.testing.assert_array_equal(restored, value, err_msg=value.path)


def test_load_model_keeps_the_optimizer_state_and_makes_it_distributed(tmp_path):
    saved = _trained(tmp_path, keras.optimizers.Adam(0.01))
    loaded = hvd.load_model(tmp_path / "model.keras", compression=hvd.Compression.fp16)
    assert is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "Adam"
    assert loaded.optimizer._hvd_reducer.compression is hvd.Compression.fp16
    _assert_same_optimizer_state(loaded.optimizer, saved.optimizer)
    # It trains on, and saves and loads again with its state.
    x = np.ones((4, 3), "float32")
    loaded.fit(x, x[:, :2], verbose=0)
    loaded.save(tmp_path / "again.keras")
    _assert_same_optimizer_state(hvd.load_model(tmp_path / "again.keras").optimizer,
                                 loaded.optimizer)


def test_load_model_restores_a_model_trained_with_distributed_optimizer(tmp_path):
    saved = _trained(tmp_path, hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    _assert_same_optimizer_state(hvd.load_model(tmp_path / "model.keras").optimizer,
                                 saved.optimizer)


def test_load_model_finds_custom_optimizers_by_class_name(tmp_path):
    class Custom(keras.optimizers.Adam):
        pass

    _trained(tmp_path, Custom(0.01))
    with pytest.raises(Exception, match="Custom"):
        hvd.load_model(tmp_path / "model.keras")
    loaded = hvd.load_model(tmp_path / "model.keras", custom_optimizers=[Custom])
    assert isinstance(loaded.optimizer, Custom) and is_distributed(loaded.optimizer)


def test_best_model_checkpoint_saves_improvements_only_atomically(tmp_path):
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True)
    with pytest.raises(UsageError, match="filepath"):
        checkpoint.on_train_begin()
    checkpoint.filepath = str(tmp_path / "best-{epoch}.weights.h5")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    losses = iter([3.0, 1.0, 2.0, 0.5])

    class FakeLoss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["loss"] = next(losses)

    x = np.ones((2, 1), "float32")
    model.fit(x, x, epochs=4, verbose=0, callbacks=[FakeLoss(), checkpoint])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best-1.weights.h5", "best-2.weights.h5", "best-4.weights.h5"]
    model.load_weights(tmp_path / "best-4.weights.h5")


def test_local_variables_are_not_made_optimizer_state(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    optimizer = hvd.PartialDistributedOptimizer(keras.optimizers.Adam(0.01),
                                                local_layers=model.layers[1])
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"), verbose=0)
    assert len(list(optimizer._hvd_local)) == 2
    assert len(optimizer.variables) == 2 + 2 * 4   # iterations, rate, two slots per weight
    model.save(tmp_path / "model.keras")
    assert len(hvd.load_model(tmp_path / "model.keras").optimizer.variables) == 10
