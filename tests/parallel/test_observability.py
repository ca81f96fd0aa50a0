"""What a run shows: rank 0's JSON-lines log, TensorBoard summaries and
Horovod's timeline of a window of steps; progress from every rank on
request; `hvdtrain report`'s plot."""

import json
import re

import pytest

from launch import horovodrun, rank_lines, run


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("observed")
    result = horovodrun(["hvdtrain", "train", "--epochs=2", f"--model_dir={model_dir}",
                         "--timeline_steps=5:8", "--verbose_all_ranks", "--intra_op_threads=1",
                         "--export=false"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return model_dir, result


def test_rank_0_logs_config_epochs_and_throughput_as_json_lines(observed_run):
    model_dir, _ = observed_run
    records = [json.loads(line) for line in (model_dir / "log.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "end"]
    start, first, second, end = records
    assert start["workers"] == 2 and start["config"]["epochs"] == 2
    assert start["config"]["timeline_steps"] == "5:8" and start["versions"]["horovod"] == "0.28.1"
    for number, epoch in ((1, first), (2, second)):
        assert epoch["epoch"] == number
        assert {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"} <= set(
            epoch["metrics"])
        steps = epoch["step_seconds"]
        assert 0 < steps["p50"] <= steps["p90"] <= steps["p99"] <= steps["max"]
    # 22 steps an epoch: epoch 1 has 1 window after the 10 warm-up steps, epoch 2 has 2.
    assert (first["throughput"]["total"]["windows"], second["throughput"]["total"]["windows"]) == (1, 2)
    total, per_worker = end["throughput"]["total"], end["throughput"]["per_worker"]
    assert total["windows"] == 3 and total["low"] < total["mean"] < total["high"]
    assert total["mean"] == pytest.approx(2 * per_worker["mean"])


def test_tensorboard_has_the_epoch_scalars(observed_run):
    import tensorflow as tf

    model_dir, _ = observed_run
    tags = set()
    for events in (model_dir / "tensorboard").rglob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            tags.update(value.tag for value in event.summary.value)
    assert {"epoch_loss", "epoch_accuracy", "epoch_examples_per_second",
            "epoch_learning_rate"} <= tags, tags


def test_timeline_records_the_window_and_says_where(observed_run):
    model_dir, result = observed_run
    path = model_dir / "timeline.json"
    assert f"Horovod timeline of steps 5-8 written to {path}" in result.stderr
    timeline = path.read_text()
    assert timeline.startswith("[") and "ALLREDUCE" in timeline and "CYCLE_START" in timeline


def test_every_rank_shows_progress_when_asked(observed_run):
    _, result = observed_run
    epochs = {rank for rank, text in rank_lines(result.stdout) if text.startswith("Epoch 2/2")}
    assert epochs == {0, 1}


def test_report_plots_the_log(observed_run):
    model_dir, _ = observed_run
    result = run(["hvdtrain", "report", model_dir], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"hvdtrain: report written to {model_dir / 'report.png'}" in result.stdout
    png = (model_dir / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def test_timeline_steps_and_horovodruns_timeline_are_refused_together(tmp_path):
    result = horovodrun(["--timeline-filename", tmp_path / "t.json", "hvdtrain", "train",
                         "--timeline_steps=1:2", f"--model_dir={tmp_path}"])
    assert result.returncode != 0
    errors = [text for _, text in rank_lines(result.stderr) if "hvdtrain: error:" in text]
    assert len(errors) == 2 and re.search(
        r"horovodrun already records a timeline to \S+t.json for the whole run", errors[0])
