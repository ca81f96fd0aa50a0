"""`hvdtrain doctor`: its report, with a real 2-process allreduce self-test
under both controllers.
Own launches: the doctor starts its own self-test jobs."""

import re

from launch import run


def test_doctor_reports_versions_build_config_and_a_correct_allreduce():
    result = run(["hvdtrain", "doctor"], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.stdout
    for section in ("versions", "Horovod build", "devices", "GPU stack", "threads",
                    "horovodrun config", "allreduce self-test, 2 local processes",
                    "NCCL self-test, one process per GPU"):
        assert re.search(rf"^{section}$", report, re.MULTILINE), report
    assert re.search(r"^  TensorFlow +2\.21\.0$", report, re.MULTILINE)
    assert re.search(r"^  Horovod +0\.28\.1$", report, re.MULTILINE)
    assert re.search(r"^  controllers +MPI, Gloo$", report, re.MULTILINE)
    assert re.search(r"^  CPU:0 +\S", report, re.MULTILINE)
    assert re.search(r"^  file +\S*horovodrun\.cfg \(valid\)$", report, re.MULTILINE)
    assert re.search(r"^  fusion_threshold_mb +64$", report, re.MULTILINE)
    # The default threads (cores / 2 each) and a Horovod thread each fill any host.
    assert re.search(r"^  MPI ranks waiting +2 processes would yield", report, re.MULTILINE)
    assert re.search(r"^  gradients \(CPU\) +2 processes would send them in one group",
                     report, re.MULTILINE)
    # The CPU flavour on a machine without a GPU (the GPU flavour's report:
    # tests/gpu_flavour).
    assert re.search(r"^  NVIDIA driver +none on this machine$", report, re.MULTILINE)
    assert re.search(r"^  TensorFlow built for +no CUDA \(a CPU build", report, re.MULTILINE)
    assert re.search(r"^  NCCL operations +not built", report, re.MULTILINE)
    assert re.search(r"^  NCCL +skipped: Horovod has no NCCL operations$", report, re.MULTILINE)
    for controller in ("Gloo", "MPI"):
        line = re.search(rf"^  {controller} +correct; 64 MiB in [\d.]+ ms: "
                         r"bus bandwidth ([\d.]+) GB/s$", report, re.MULTILINE)
        assert line and float(line.group(1)) > 0, report


def test_doctor_names_a_bad_config_file(tmp_path):
    bad = tmp_path / "bad.cfg"
    bad.write_text("params:\n  fusion_treshold_mb: 64\n")
    result = run(["hvdtrain", "doctor", "--noself_test", bad], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^  problem +.*fusion_treshold_mb", result.stdout,
                     re.MULTILINE), result.stdout
    assert "self-test" not in result.stdout
