"""The Keras training knobs at np=2, as `hvdtrain train` sets them:
optimizers by name, weight decay and clipping against one process on the
global batch; early stopping and the plateau schedule deciding on metrics
averaged over the ranks, and resuming where they stood; the weights' moving
average validated, checkpointed, resumed and exported, under XLA."""

import json
import re
import shutil

import keras
import numpy as np
import pytest

from hvdtrain import runtime
from hvdtrain.state import checkpoint
from hvdtrain.tools import run_log
from launch import REPO, hvdtrain_command, run, worker
from ranked.support import computed_once, gathered
from workers import optimizers

SCORES = REPO / "tests" / "recipes" / "rank_scores.py"
FAULTS = REPO / "tests" / "recipes" / "faults.py"

pytestmark = pytest.mark.launches(controllers=("gloo",))


def _ok(result):
    """Each rank's output (stdout, then stderr), once the command ended with
    status 0 on every rank (horovodrun's status 0)."""
    results = gathered(result)
    assert all(r.status == 0 for r in results), "".join(r.output[-3000:] for r in results)
    return [r.output for r in results]


def _single_process_optimizers(out):
    result = run([*worker("optimizers"), out])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_every_optimizer_at_np2_equals_np1_on_the_global_batch_clipping_included():
    np1_dir = computed_once("training-knobs-optimizers-np1", _single_process_optimizers)
    np1 = {p.stem: np.load(p) for p in np1_dir.glob("*.npz")}
    np2 = gathered({case: optimizers.train(settings)
                    for case, settings in optimizers.CASES.items()})[0]   # rank 0's
    assert set(np1) == set(np2) and {"lamb", "lion", "adafactor", "sgd_clipnorm"} <= set(np1)
    for case in np1:
        for a, b in zip(np1[case].values(), np2[case], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=case)

    def moved(a, b):
        return max(np.abs(x - y).max() for x, y in zip(np1[a].values(), np1[b].values()))

    # Each knob changed the training (clipping binds): applied to each rank's
    # own gradients instead of their average, it would not have matched.
    for knob, plain in (("sgd_clipnorm", "sgd"), ("sgd_clipvalue", "sgd"),
                        ("sgd_nesterov_decay", "sgd"), ("adam_global_clipnorm", "adam"),
                        ("adamw", "adam")):
        assert moved(knob, plain) > 1e-3, knob
    # Adam with EMA: fit ends with the moving averages as the weights, which
    # Adam's own weights are not.
    ema = list(np1["adam_ema"].values())
    assert len(ema) == 2 * len(np1["adam"].files)
    for weight, plain, average in zip(ema, np1["adam"].values(), ema[len(ema) // 2:]):
        np.testing.assert_array_equal(weight, average)
        assert not np.allclose(weight, plain)


def _scores(model_dir):
    return [(r["epoch"], r["metrics"]["score"], r["metrics"]["learning_rate"])
            for r in run_log.read(model_dir) if r["event"] == "epoch"]


def _copy_checkpoint(source, model_dir):
    """Rank 0 starts `model_dir` with the checkpoint `source` alone; every
    rank goes on once it is there."""
    if runtime.is_main_process():
        (model_dir / "checkpoints").mkdir(parents=True)
        shutil.copytree(source, model_dir / "checkpoints" / source.name)
    runtime.barrier()


@pytest.mark.slow
def test_early_stopping_and_the_plateau_decide_on_the_average_over_ranks(
        shared_tmp_path, capfd):
    # rank_scores: each rank's own score differs; rank 0's alone would never
    # stop, rank 1's would stop after epoch 3 (and lower the rate earlier).
    flags = [f"--recipe={SCORES}", "--early_stopping_patience=2", "--lr_schedule=plateau",
             "--plateau_patience=1", "--plateau_factor=0.5", "--keep_checkpoints=10",
             "--verbose_all_ranks"]
    model_dir = shared_tmp_path / "run"
    outputs = _ok(hvdtrain_command(capfd, "train", f"--model_dir={model_dir}", *flags))
    lr = 0.001 * 2
    assert _scores(model_dir) == [(1, 10.0, pytest.approx(lr)), (2, 9.5, pytest.approx(lr)),
                                  (3, 10.5, pytest.approx(lr)),
                                  (4, 11.5, pytest.approx(lr / 2))]
    for rank in (0, 1):
        lines = outputs[rank].splitlines()
        assert [t for t in lines if t.startswith("Epoch ")][-1] == "Epoch 4/6"
        assert any("early stopping after epoch 4: score has not improved for 2 epoch(s)" in t
                   for t in lines), rank
    assert "4 epochs (stopped early)" in "".join(outputs)
    assert checkpoint.listed(model_dir / "checkpoints")[0].name == "epoch-0004-step-000004"

    # Resumed after epoch 3, the count and the lowering go on where they stood.
    resumed = shared_tmp_path / "resumed"
    _copy_checkpoint(model_dir / "checkpoints" / "epoch-0003-step-000004", resumed)
    _ok(hvdtrain_command(capfd, "train", f"--model_dir={resumed}", "--resume", *flags))
    assert _scores(resumed) == [(4, 11.5, pytest.approx(lr / 2))]
    # A run that stopped stays stopped.
    again = "".join(_ok(hvdtrain_command(capfd, "train", f"--model_dir={resumed}", "--resume",
                                         *flags)))
    assert "training stopped early after epoch 4" in again
    assert _scores(resumed) == [(4, 11.5, pytest.approx(lr / 2))]


KNOBS = [f"--recipe={FAULTS}", "--epochs=3", "--optimizer=adamw", "--weight_decay=0.01",
         "--learning_rate=0.01", "--clipnorm=1.0", "--ema_momentum=0.9", "--jit_compile",
         "--deterministic", "--checkpoint_steps=10", "--keep_checkpoints=20"]


def _profiles(model_dir):
    """The TensorFlow profiles under `model_dir`, one XSpace per trace file."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    spaces = []
    for path in (model_dir / "tensorboard" / "train" / "plugins" / "profile").glob("*/*.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        spaces.append(space)
    return spaces


def _events(space):
    """(the plane's metadata of the event, the event) of every event."""
    return [(plane, event) for plane in space.planes for line in plane.lines
            for event in line.events]


def _profiled_steps(model_dir):
    """The steps each TensorFlow profile under `model_dir` recorded, per trace file."""
    return [sorted(stat.int64_value for plane, event in _events(space)
                   if plane.event_metadata[event.metadata_id].name == "train"
                   for stat in event.stats
                   if plane.stat_metadata[stat.metadata_id].name == "step_num")
            for space in _profiles(model_dir)]


# What XLA compiled runs as an XLA CPU executable (the profile's event).
# TensorFlow's log, "Compiled cluster using XLA", comes at a process's first
# compilation only: a rank of a ranked launch may have compiled in an
# earlier test.
XLA_EXECUTABLE_RUNS = "CpuExecutable::ExecuteAsyncOnStream"


def _compiled_by_xla(model_dir):
    """Whether the steps of the run's profile ran what XLA compiled."""
    return any(plane.event_metadata[event.metadata_id].name == XLA_EXECUTABLE_RUNS
               for space in _profiles(model_dir) for plane, event in _events(space))


def _average_of(path, weights):
    """The moving averages a checkpoint holds, in the order of the weights."""
    found, values = checkpoint.read(path)
    meta = json.loads((path / checkpoint.META).read_text())
    averages = [v for name, v in zip(meta["names"], values) if name.endswith("_average")]
    assert [a.shape for a in averages] == [w.shape for w in weights]
    return averages


@pytest.mark.slow
def test_the_moving_average_is_validated_checkpointed_resumed_and_exported(shared_tmp_path,
                                                                            capfd):
    reference = shared_tmp_path / "reference"
    output = "".join(_ok(hvdtrain_command(capfd, "train", f"--model_dir={reference}", *KNOBS,
                                          "--profile_steps=30:34")))
    assert _compiled_by_xla(reference), output[-3000:]
    # Rank 0's profile of its window only, across the first epoch's end (32 steps).
    assert _profiled_steps(reference) == [[30, 31, 32, 33, 34]]
    exported = keras.saving.load_model(reference / "model.keras").get_weights()
    newest = checkpoint.listed(reference / "checkpoints")[0]
    assert newest.name == "epoch-0003-step-000032"
    for weight, average in zip(exported, _average_of(newest, exported), strict=True):
        np.testing.assert_array_equal(weight, average)
    raw = checkpoint.read(newest)[1][:len(exported)]
    assert not all(np.allclose(w, r) for w, r in zip(exported, raw))

    # Validation evaluated the moving average: hvdtrain evaluate of the
    # exported model (which holds it) reports what training did.
    evaluated = "".join(_ok(hvdtrain_command(capfd, "evaluate", f"--model_dir={reference}")))
    assert re.search(r"model.keras on split validation \(128 examples, 2 workers\)", evaluated)
    reported = [r for r in run_log.read(reference) if r["event"] == "epoch"][-1]["metrics"]
    metrics = json.loads((reference / "evaluation-validation.json").read_text())["metrics"]
    assert metrics == {"accuracy": pytest.approx(reported["val_accuracy"], rel=1e-6),
                       "loss": pytest.approx(reported["val_loss"], rel=1e-6)}
    # So does the last checkpoint, on the moving averages it holds.
    _ok(hvdtrain_command(capfd, "evaluate", f"--model_dir={reference}",
                         "--checkpoint=epoch-0003-step-000032"))
    assert json.loads((reference / "evaluation-validation-epoch-0003-step-000032.json")
                      .read_text())["metrics"] == pytest.approx(metrics, rel=1e-6)

    # Resumed from the middle of epoch 2, the run ends where the reference did.
    resumed = shared_tmp_path / "resumed"
    _copy_checkpoint(reference / "checkpoints" / "epoch-0002-step-000008", resumed)
    _ok(hvdtrain_command(capfd, "train", f"--model_dir={resumed}", "--resume", *KNOBS))
    for a, b in zip(exported, keras.saving.load_model(resumed / "model.keras").get_weights(),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
