"""`make demo` at np=2 reaches 95% validation accuracy, its progress and
results from rank 0 only.
Own launches: the demo is a launch (make demo, horovodrun with its config file)."""

import re

from launch import rank_lines, run


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
