"""The synthetic ResNet-50 benchmark at np=2 on tiny images: it reports
images/s per worker and in total with a 95% interval over the timed
windows, and writes no checkpoint or model."""

import re

import pytest

from launch import REPO, hvdtrain_command
from ranked.support import gathered

TINY = ["--option=image_size=32", "--option=num_classes=10", "--batch_size=4",
        "--throughput_warmup_steps=2", "--throughput_window_steps=2", "--intra_op_threads=1"]
RATE = r"([\d.]+) images/s \(95% interval ([\d.]+)-([\d.]+)\)"


@pytest.mark.slow
@pytest.mark.parametrize("entry, controller, flags", [
    pytest.param("script", "gloo", ["--compression=fp16", "--option=iterations=3"],
                 marks=pytest.mark.launches(controllers=("gloo",))),
    pytest.param("command", "mpi", ["--precision=mixed_bfloat16", "--option=iterations=2"],
                 marks=pytest.mark.launches(controllers=("mpi",))),
])
def test_benchmark_reports_rates_with_intervals(shared_tmp_path, capfd, entry, controller, flags):
    script = REPO / "recipes" / "resnet50_synthetic.py" if entry == "script" else None
    command = [] if script else ["train", "--recipe=resnet50_synthetic"]
    ended = gathered(hvdtrain_command(capfd, *command, *TINY, *flags,
                                      f"--model_dir={shared_tmp_path / 'run'}", script=script))
    assert [e.status for e in ended] == [0, 0], "".join(e.output[-3000:] for e in ended)
    stdout = "".join(e.stdout for e in ended)   # rank 0 reports
    line = re.search(rf"hvdtrain: throughput {RATE} on 2 workers, {RATE} per worker; "
                     r"(\d+) windows of 2 steps after 2 warm-up steps", stdout)
    assert line, stdout[-3000:]
    total, total_low, total_high, worker, worker_low, worker_high, windows = (
        float(v) for v in line.groups())
    assert windows == int(flags[-1].rsplit("=", 1)[1])
    assert total_low <= total <= total_high and worker_low <= worker <= worker_high
    assert total == pytest.approx(2 * worker, abs=0.2)
    assert re.search(r"resnet50_synthetic on 2 workers, 1 epoch in [\d.]+ s: loss \d", stdout)
    # A benchmark: no checkpoint, no exported model; its log and summaries.
    assert sorted(p.name for p in (shared_tmp_path / "run").iterdir()) == [
        "log.jsonl", "run.lock", "tensorboard"]
