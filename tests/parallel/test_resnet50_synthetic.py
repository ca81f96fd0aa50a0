"""The synthetic ResNet-50 benchmark at np=2 on tiny images: it reports
images/s per worker and in total with a 95% interval over the timed
windows, and writes no checkpoint or model."""

import re
import sys

import pytest

from launch import REPO, horovodrun

TINY = ["--option=image_size=32", "--option=num_classes=10", "--batch_size=4",
        "--throughput_warmup_steps=2", "--throughput_window_steps=2", "--intra_op_threads=1"]
RATE = r"([\d.]+) images/s \(95% interval ([\d.]+)-([\d.]+)\)"


@pytest.mark.parametrize("entry, controller, flags", [
    ("script", "gloo", ["--compression=fp16", "--option=iterations=3"]),
    ("command", "mpi", ["--precision=mixed_bfloat16", "--option=iterations=2"]),
])
def test_benchmark_reports_rates_with_intervals(tmp_path, entry, controller, flags):
    command = ([sys.executable, REPO / "recipes" / "resnet50_synthetic.py"] if entry == "script"
               else ["hvdtrain", "train", "--recipe=resnet50_synthetic"])
    result = horovodrun([*command, *TINY, *flags, f"--model_dir={tmp_path / 'run'}"],
                        controller=controller, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = re.search(rf"hvdtrain: throughput {RATE} on 2 workers, {RATE} per worker; "
                     r"(\d+) windows of 2 steps after 2 warm-up steps", result.stdout)
    assert line, result.stdout[-3000:]
    total, total_low, total_high, worker, worker_low, worker_high, windows = (
        float(v) for v in line.groups())
    assert windows == int(flags[-1].rsplit("=", 1)[1])
    assert total_low <= total <= total_high and worker_low <= worker <= worker_high
    assert total == pytest.approx(2 * worker, abs=0.2)
    assert re.search(r"resnet50_synthetic on 2 workers, 1 epoch in [\d.]+ s: loss \d", result.stdout)
    # A benchmark: no checkpoint, no exported model; its log and summaries.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "log.jsonl", "run.lock", "tensorboard"]
