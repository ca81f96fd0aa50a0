"""bench/alternatives.py at a tiny size, hvdtrain against Horovod's ops alone and
MultiWorkerMirroredStrategy (the Keras 2 environment is not built here): it
writes the throughputs, the CPU per step by kind of thread, the ratios and
the chart.
Own launches: the benchmark starts its contenders' jobs itself."""

import json
import sys

import pytest

from launch import REPO, run


def test_alternatives_reports_throughputs_and_ratio(tmp_path):
    output = tmp_path / "alternatives.json"
    result = run([sys.executable, REPO / "bench" / "alternatives.py",
                  "--contenders=hvdtrain,horovod_ops,mwms",
                  "--rounds=1", "--batch_size=16", "--examples=64", "--warmup_steps=2",
                  "--window_steps=2", "--windows=2", f"--output={output}"], timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(output.read_text())
    assert set(results["contenders"]) == {"hvdtrain", "horovod_ops", "mwms"}
    for contender in results["contenders"].values():
        assert contender["examples_per_second"] > 0 and contender["cpu_ms_per_step"] > 0
        kinds = contender["cpu_ms_per_step_by_kind"]
        assert list(kinds) == ["compute", "python", "other"] and kinds["compute"] > 0
        assert min(kinds.values()) >= 0
        assert contender["per_worker"] == pytest.approx(contender["examples_per_second"] / 2)
        assert len(contender["rounds"]) == 1 and len(contender["rounds"][0]["window_totals"]) == 2
    assert results["contenders"]["hvdtrain"]["versions"]["keras"].startswith("3.")
    ratio = results["contenders"]["hvdtrain"]["examples_per_second"] / \
        results["contenders"]["mwms"]["examples_per_second"]
    assert set(results["ratios"]) == {"hvdtrain/horovod_ops", "hvdtrain/mwms"}
    name, paired = "hvdtrain/mwms", results["ratios"]["hvdtrain/mwms"]
    # One round: its ratio, no interval; a verdict all the same.
    assert name == "hvdtrain/mwms" and paired["ratio"] == pytest.approx(ratio)
    assert paired["rounds"] == [pytest.approx(ratio)] and paired["low"] is paired["high"] is None
    assert paired["verdict"] == ("met" if ratio >= 1 else "NOT met")
    assert results["missing"] == {}
    assert output.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert "hvdtrain / each other >= 1.0" in result.stdout
