"""The demo's command line at np=2 with the precision and gradient-exchange
flags: it trains too."""

import re

import pytest

from launch import hvdtrain_command
from ranked.support import gathered


@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_cli_trains_with_bfloat16_compression_accumulation_and_one_group(shared_tmp_path, capfd):
    ended = gathered(hvdtrain_command(
        capfd, "train", f"--model_dir={shared_tmp_path}", "--epochs=6",
        "--precision=mixed_bfloat16", "--compression=bf16", "--backward_passes_per_step=2",
        "--allreduce_groups=1"))
    assert [e.status for e in ended] == [0, 0], "".join(e.output[-3000:] for e in ended)
    stdout = "".join(e.stdout for e in ended)
    accuracy = re.search(r"val_accuracy (\d\.\d+)", stdout)
    assert accuracy and float(accuracy.group(1)) >= 0.85, stdout[-3000:]
