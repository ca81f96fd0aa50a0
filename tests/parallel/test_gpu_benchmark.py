"""bench/gpu_resnet50.py, sized for one H200, runs end to end at a tiny size
on CPU: every contender and its JSON. (mixed_float16 convolutions take
minutes on CPU, so they are left to the GPU.)"""

import json
import sys

import pytest

from launch import REPO, run


def test_gpu_benchmark_runs_tiny_on_cpu(tmp_path):
    output = tmp_path / "gpu.json"
    result = run([sys.executable, REPO / "bench" / "gpu_resnet50.py", "--image_size=32",
                  "--num_classes=10", "--batch_size=2", "--warmup_steps=1", "--window_steps=2",
                  "--windows=2", "--precisions=float32,mixed_bfloat16", f"--output={output}"],
                 timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(output.read_text())
    assert results["device"] == "CPU"
    assert [(r["precision"], r["contender"]) for r in results["runs"]] == [
        (precision, contender) for precision in ("float32", "mixed_bfloat16")
        for contender in ("keras", "hvdtrain", "hvdtrain_xla")]
    for r in results["runs"]:
        assert r["images_per_second"] > 0 and r["windows"] == 2
    rates = {(r["precision"], r["contender"]): r["images_per_second"] for r in results["runs"]}
    for precision in ("float32", "mixed_bfloat16"):
        assert results["ratios"][precision] == pytest.approx(
            rates[precision, "hvdtrain"] / rates[precision, "keras"])
        assert results["xla_ratios"][precision] == pytest.approx(
            rates[precision, "hvdtrain_xla"] / rates[precision, "hvdtrain"])
