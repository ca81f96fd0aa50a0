"""The GPU flavour (`HVDTRAIN_GPU=1 scripts/install.sh`: tensorflow[and-cuda]
and Horovod with NCCL operations), tested on a machine without a GPU: what
was built and linked, and that it is the same product as the CPU flavour
(the default recipe learns under MPI and Gloo). Run in that environment:
`make test-gpu`."""

import json
import os
import pathlib
import re
import subprocess
import sys

import horovod.tensorflow as hvd
import pytest

from launch import REPO, horovodrun, run

pytestmark = pytest.mark.skipif(not hvd.nccl_built(),
                                reason="needs the GPU flavour's environment: make test-gpu")

SITE = pathlib.Path(hvd.__file__).parents[2]
LIBRARY = next((SITE / "horovod" / "tensorflow").glob("mpi_lib*.so"))


def _pinned(name):
    text = (REPO / "constraints.txt").read_text()
    return re.search(rf"^{re.escape(name)}==(\S+)$", text, re.MULTILINE).group(1)


def test_horovod_has_nccl_mpi_and_gloo_operations():
    report = run(["horovodrun", "--check-build"], timeout=120).stdout
    operations = report[report.index("Available Tensor Operations"):]
    for name in ("NCCL", "MPI", "Gloo"):
        assert re.search(rf"\[X\] {name}\b", operations), report
    assert re.search(r"\[X\] TensorFlow", report) and re.search(r"\[X\] Gloo", report)
    # nccl_built() is NCCL's version code: the NCCL the install pins.
    major, minor, patch = map(int, _pinned("nvidia-nccl-cu12").split("."))
    assert hvd.nccl_built() == major * 10000 + minor * 100 + patch


def test_one_nccl_from_tensorflows_packages_found_without_ld_library_path():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", LIBRARY], capture_output=True, text=True, env=env,
                         check=True).stdout
    nccl = [line for line in ldd.splitlines() if "libnccl" in line]
    assert len(nccl) == 1, ldd
    assert (SITE / "nvidia" / "nccl" / "lib" / "libnccl.so.2").resolve().as_posix() in \
        pathlib.Path(nccl[0].split("=>")[1].split()[0]).resolve().as_posix(), ldd
    # No CUDA runtime of Horovod's own: its CUDA calls use TensorFlow's.
    assert "libcudart" not in ldd, ldd
    dynamic = subprocess.run(["readelf", "-d", LIBRARY], capture_output=True, text=True,
                             check=True).stdout
    assert "$ORIGIN/../../nvidia/nccl/lib" in dynamic, dynamic


@pytest.mark.timeout(600)
@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_default_recipe_trains(controller, tmp_path):
    # The demo's first 2 epochs: learning, well past chance (the whole demo's
    # bar is the CPU flavour's test, with the same code).
    result = horovodrun(["--config-file", "horovodrun.cfg", "hvdtrain", "train",
                         "--recipe=digits_cnn", f"--model_dir={tmp_path}", "--epochs=2"],
                        controller=controller, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = re.search(r"digits_cnn on 2 workers, \d+ epochs in [\d.]+ s: "
                        r"val_accuracy (\d\.\d+)", result.stdout)
    assert summary and float(summary.group(1)) >= 0.5, result.stdout[-3000:]
    assert (tmp_path / "model.keras").stat().st_size > 0


def test_doctor_reports_the_gpu_stack():
    result = run(["hvdtrain", "doctor"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    assert re.search(r"^  TensorFlow built for +CUDA 12\.\d+(\.\d+)?, cuDNN 9$", report,
                     re.MULTILINE), report
    nccl = _pinned("nvidia-nccl-cu12")
    assert re.search(rf"^  NCCL operations +built with NCCL {re.escape(nccl)}$", report,
                     re.MULTILINE), report
    runtime = re.search(r"^  NCCL at run time +NCCL (\S+) from (\S+)$", report, re.MULTILINE)
    assert runtime and runtime.group(1) == nccl, report
    assert "site-packages/nvidia/nccl/lib/libnccl.so.2" in runtime.group(2)
    build = json.loads((pathlib.Path(sys.prefix) / "horovod-build.json").read_text())
    assert re.search(rf"^  Horovod's GPU kernels +CUDA {re.escape(build['cuda_compiler'])}, "
                     rf"compute capabilities {build['cuda_architectures']} "
                     rf"\(driver {build['driver']}\+\)$", report, re.MULTILINE), report
    assert re.search(r"^  NVIDIA driver +none on this machine$", report, re.MULTILINE)
    assert re.search(r"^  NCCL +skipped: no GPU visible$", report, re.MULTILINE), report
    assert re.search(r"^  Gloo +correct; ", report, re.MULTILINE), report


@pytest.fixture(scope="module")
def gpu_check(tmp_path_factory):
    """bench/gpu_check.py --tiny, once: its run and its JSON."""
    output = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    result = run([sys.executable, REPO / "bench" / "gpu_check.py", "--tiny",
                  f"--output={output}"], timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(output.read_text())


@pytest.mark.timeout(900)
def test_the_gpu_check_runs_tiny_on_cpu(gpu_check):
    result, results = gpu_check
    assert results["ok"] and results["gpus"] == 0 and results["tiny"]
    assert results["doctor"]["report"]["GPU stack"]["NCCL operations"].startswith("built")
    assert [(r["precision"], r["contender"]) for r in results["resnet50"]["runs"]] == [
        (precision, contender) for precision in ("float32", "mixed_bfloat16")
        for contender in ("keras", "hvdtrain", "hvdtrain_xla")]
    assert results["demo"]["workers"] == 2 and results["demo"]["val_accuracy"] > 0.5
    assert results["sharded"]["workers"] == 2 and results["sharded"]["val_auc"] > 0.65
    for gpt in ("tensor", "pipeline"):
        assert results[gpt]["workers"] == 2 and results[gpt]["val_loss"] > 0
        assert "tokens/s" in results[gpt]["model_flops"]
    assert "--pipeline_parallel=2" in results["pipeline"]["command"]
    for line in ("doctor", "resnet50", "demo", "sharded", "tensor", "pipeline"):
        assert re.search(rf"^gpu_check: {line} +ok \(\d+ s\)$", result.stdout, re.MULTILINE)


@pytest.mark.timeout(900)
def test_gpu_benchmark_runs_tiny_on_cpu(gpu_check):
    # bench/gpu_resnet50.py, sized for one H200, end to end at a tiny size on
    # CPU (gpu_check's run of it): every contender and its JSON.
    # (mixed_float16 convolutions take minutes on CPU: left to the GPU.)
    results = gpu_check[1]["resnet50"]
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
