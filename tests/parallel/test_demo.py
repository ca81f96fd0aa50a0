"""The command line at np=2: `make demo` reaches 95% validation accuracy, and
the precision and gradient-exchange flags train too."""

import re

from launch import horovodrun, rank_lines, run


def test_make_demo_reaches_95_percent_and_writes_the_model(tmp_path):
    result = run(["make", "demo", f"MODEL_DIR={tmp_path}"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = re.search(r"digits_cnn on 2 workers, \d+ epochs in [\d.]+ s: "
                        r"val_accuracy (\d\.\d+)", result.stdout)
    assert summary, result.stdout[-3000:]
    assert float(summary.group(1)) >= 0.95
    assert f"model written to {tmp_path / 'model.keras'}" in result.stdout
    assert (tmp_path / "model.keras").stat().st_size > 0
    # Progress and results come from rank 0 only.
    printed = rank_lines(result.stdout)
    assert any(text.startswith("Epoch 1/") for rank, text in printed if rank == 0)
    assert not [text for rank, text in printed if rank != 0 and text.strip()]


def test_cli_trains_with_bfloat16_compression_accumulation_and_one_group(tmp_path):
    result = horovodrun(["hvdtrain", "train", f"--model_dir={tmp_path}", "--epochs=6",
                         "--precision=mixed_bfloat16", "--compression=bf16",
                         "--backward_passes_per_step=2", "--allreduce_groups=1"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accuracy = re.search(r"val_accuracy (\d\.\d+)", result.stdout)
    assert accuracy and float(accuracy.group(1)) >= 0.85, result.stdout[-3000:]
