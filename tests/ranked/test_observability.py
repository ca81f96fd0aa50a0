"""What a run shows: rank 0's JSON-lines log, TensorBoard summaries and
Horovod's timeline of a window of steps; progress from every rank on
request; `hvdtrain report`'s plot."""

import json

import pytest

from launch import hvdtrain_command, run
from ranked.support import gathered, on_rank_0

# The run was one horovodrun (no controller named: Gloo).
# Every test reads one training of the digits recipe.
pytestmark = [pytest.mark.launches(controllers=("gloo",)), pytest.mark.slow]


@pytest.fixture(scope="module")
def _observed():
    """The run, once the first test of the module made it."""
    return {}


@pytest.fixture
def observed_run(_observed, shared_tmp_path, capfd):
    """The model directory (every rank's) and [rank 0's Finished, rank 1's]
    of one `hvdtrain train` on every rank, made by the module's first test
    (on every rank alike) and shared by the others."""
    if "run" not in _observed:
        model_dir = shared_tmp_path / "observed"
        finished = gathered(hvdtrain_command(
            capfd, "train", "--epochs=2", f"--model_dir={model_dir}", "--timeline_steps=5:8",
            "--verbose_all_ranks", "--intra_op_threads=1", "--export=false"))
        _observed["run"] = model_dir, finished
    model_dir, finished = _observed["run"]
    assert [result.status for result in finished] == [0, 0], "".join(
        result.stdout[-3000:] + result.stderr[-3000:] for result in finished)
    return model_dir, finished


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
    windows = [epoch["throughput"]["total"]["windows"] for epoch in (first, second)]
    assert windows == [1, 2]
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
    model_dir, finished = observed_run
    path = model_dir / "timeline.json"
    assert f"Horovod timeline of steps 5-8 written to {path}" in "".join(
        result.stderr for result in finished)
    timeline = path.read_text()
    assert timeline.startswith("[") and "ALLREDUCE" in timeline and "CYCLE_START" in timeline


def test_the_timeline_writer_waits_for_records_without_spinning_a_core(observed_run):
    """Horovod starts its timeline writer on rank 0 at init whenever a timeline
    may be recorded (this launch, as --timeline_steps does), and its loop used
    to wait for records by yielding: a whole core for the rest of the run
    (fixed in Horovod's source at install). Its thread is the one rank 1 does
    not have: rank 0's busiest thread in 2 s of sleep is measured against rank
    1's, whose other threads (Horovod's background loop above all) are the
    same and as slowed by a loaded machine."""
    import time

    before = _cpu_seconds_by_thread()
    time.sleep(2)
    after = _cpu_seconds_by_thread()
    busiest = max(after[thread] - before.get(thread, 0.0) for thread in after)
    on_rank_0, on_rank_1 = gathered(busiest)
    # A spinning writer takes most of 2 s; a sleeping one, milliseconds.
    assert on_rank_0 < on_rank_1 + 0.5, (on_rank_0, on_rank_1)


def _cpu_seconds_by_thread():
    """{thread id: its CPU seconds so far} of this process's threads."""
    import os

    seconds = {}
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/stat") as stat:
                # utime and stime, after the command name (in parentheses).
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:   # the thread ended meanwhile
            continue
        seconds[thread] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def test_every_rank_shows_progress_when_asked(observed_run):
    _, finished = observed_run
    epochs = {rank for rank, result in enumerate(finished)
              for text in result.stdout.splitlines() if text.startswith("Epoch 2/2")}
    assert epochs == {0, 1}


def test_report_plots_the_log(observed_run):
    model_dir, _ = observed_run
    # One process, as a user runs it (started by rank 0: it writes in the run's directory).
    result = on_rank_0(run, ["hvdtrain", "report", model_dir], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"hvdtrain: report written to {model_dir / 'report.png'}" in result.stdout
    png = (model_dir / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
