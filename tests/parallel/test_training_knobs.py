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

from hvdtrain import checkpoint, run_log
from launch import REPO, horovodrun, rank_lines, run, worker

SCORES = REPO / "tests" / "recipes" / "rank_scores.py"
FAULTS = REPO / "tests" / "recipes" / "faults.py"


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def test_every_optimizer_at_np2_equals_np1_on_the_global_batch_clipping_included(tmp_path):
    (tmp_path / "np1").mkdir()
    (tmp_path / "np2").mkdir()
    _ok(run([*worker("optimizers"), tmp_path / "np1"]))
    _ok(horovodrun([*worker("optimizers"), tmp_path / "np2"]))
    np1 = {p.stem: np.load(p) for p in (tmp_path / "np1").glob("*.npz")}
    np2 = {p.stem: np.load(p) for p in (tmp_path / "np2").glob("*.npz")}
    assert set(np1) == set(np2) and {"lamb", "lion", "adafactor", "sgd_clipnorm"} <= set(np1)
    for case in np1:
        for a, b in zip(np1[case].values(), np2[case].values(), strict=True):
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


def test_early_stopping_and_the_plateau_decide_on_the_average_over_ranks(tmp_path):
    # rank_scores: each rank's own score differs; rank 0's alone would never
    # stop, rank 1's would stop after epoch 3 (and lower the rate earlier).
    flags = [f"--recipe={SCORES}", "--early_stopping_patience=2", "--lr_schedule=plateau",
             "--plateau_patience=1", "--plateau_factor=0.5", "--keep_checkpoints=10",
             "--verbose_all_ranks"]
    model_dir = tmp_path / "run"
    output = _ok(horovodrun(["hvdtrain", "train", f"--model_dir={model_dir}", *flags]))
    lr = 0.001 * 2
    assert _scores(model_dir) == [(1, 10.0, pytest.approx(lr)), (2, 9.5, pytest.approx(lr)),
                                  (3, 10.5, pytest.approx(lr)),
                                  (4, 11.5, pytest.approx(lr / 2))]
    for rank in (0, 1):
        lines = [text for r, text in rank_lines(output) if r == rank]
        assert [t for t in lines if t.startswith("Epoch ")][-1] == "Epoch 4/6"
        assert any("early stopping after epoch 4: score has not improved for 2 epoch(s)" in t
                   for t in lines), rank
    assert "4 epochs (stopped early)" in output
    assert checkpoint.listed(model_dir / "checkpoints")[0].name == "epoch-0004-step-000004"

    # Resumed after epoch 3, the count and the lowering go on where they stood.
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(model_dir / "checkpoints" / "epoch-0003-step-000004",
                    resumed / "checkpoints" / "epoch-0003-step-000004")
    _ok(horovodrun(["hvdtrain", "train", f"--model_dir={resumed}", "--resume", *flags]))
    assert _scores(resumed) == [(4, 11.5, pytest.approx(lr / 2))]
    # A run that stopped stays stopped.
    again = _ok(horovodrun(["hvdtrain", "train", f"--model_dir={resumed}", "--resume", *flags]))
    assert "training stopped early after epoch 4" in again
    assert _scores(resumed) == [(4, 11.5, pytest.approx(lr / 2))]


KNOBS = [f"--recipe={FAULTS}", "--epochs=3", "--optimizer=adamw", "--weight_decay=0.01",
         "--learning_rate=0.01", "--clipnorm=1.0", "--ema_momentum=0.9", "--jit_compile",
         "--deterministic", "--checkpoint_steps=10", "--keep_checkpoints=20"]


def _profiled_steps(model_dir):
    """The steps each TensorFlow profile under `model_dir` recorded, per trace file."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    traces = {}
    for path in (model_dir / "tensorboard" / "train" / "plugins" / "profile").glob("*/*.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        traces[path] = sorted(
            stat.int64_value for plane in space.planes for line in plane.lines
            for event in line.events
            if plane.event_metadata[event.metadata_id].name == "train"
            for stat in event.stats if plane.stat_metadata[stat.metadata_id].name == "step_num")
    return list(traces.values())


def _average_of(path, weights):
    """The moving averages a checkpoint holds, in the order of the weights."""
    found, values = checkpoint.read(path)
    meta = json.loads((path / checkpoint.META).read_text())
    averages = [v for name, v in zip(meta["names"], values) if name.endswith("_average")]
    assert [a.shape for a in averages] == [w.shape for w in weights]
    return averages


def test_the_moving_average_is_validated_checkpointed_resumed_and_exported(tmp_path):
    reference = tmp_path / "reference"
    output = _ok(horovodrun(["hvdtrain", "train", f"--model_dir={reference}", *KNOBS,
                             "--profile_steps=30:34"]))
    assert "Compiled cluster using XLA" in output
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
    evaluated = _ok(horovodrun(["hvdtrain", "evaluate", f"--model_dir={reference}"]))
    assert re.search(r"model.keras on split validation \(128 examples, 2 workers\)", evaluated)
    reported = [r for r in run_log.read(reference) if r["event"] == "epoch"][-1]["metrics"]
    metrics = json.loads((reference / "evaluation-validation.json").read_text())["metrics"]
    assert metrics == {"accuracy": pytest.approx(reported["val_accuracy"], rel=1e-6),
                       "loss": pytest.approx(reported["val_loss"], rel=1e-6)}
    # So does the last checkpoint, on the moving averages it holds.
    _ok(horovodrun(["hvdtrain", "evaluate", f"--model_dir={reference}",
                    "--checkpoint=epoch-0003-step-000032"]))
    assert json.loads((reference / "evaluation-validation-epoch-0003-step-000032.json")
                      .read_text())["metrics"] == pytest.approx(metrics, rel=1e-6)

    # Resumed from the middle of epoch 2, the run ends where the reference did.
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "epoch-0002-step-000008",
                    resumed / "checkpoints" / "epoch-0002-step-000008")
    _ok(horovodrun(["hvdtrain", "train", f"--model_dir={resumed}", "--resume", *KNOBS]))
    for a, b in zip(exported, keras.saving.load_model(resumed / "model.keras").get_weights(),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
