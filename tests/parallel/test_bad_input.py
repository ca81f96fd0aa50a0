"""Bad input at np=2 ends every rank with one clear line and the job with a
non-zero exit, never a hang (alone: tests/unit/test_bad_input.py; evaluate's:
tests/ranked/test_bad_input.py).

Own launches: the launcher's handling of ranks that exit with status 2 ends the job."""

import re

import pytest

from launch import horovodrun, rank_lines
from unit.test_bad_input import BAD_INPUT


@pytest.mark.parametrize("case", ["unknown recipe", "zero batch size", "unreadable flagfile",
                                  "model_dir is a file"])
def test_every_rank_reports_and_the_job_fails(case, controller):
    args, expected = BAD_INPUT[case]
    result = horovodrun(["hvdtrain", "train", *args], controller=controller, timeout=90)
    output = result.stdout + result.stderr
    # The launcher ends with the status its first failing rank exited with,
    # after one line naming it (and nothing of its own besides).
    assert result.returncode == 2, output[-2000:]
    launcher_lines = [line for line in output.splitlines() if not re.match(r"\[[\d,]+\]<", line)]
    assert len(launcher_lines) == 1, output[-2000:]
    assert re.fullmatch(r"horovodrun: rank [01] exited with status 2", launcher_lines[0])
    errors = [(rank, text) for rank, text in rank_lines(output) if "hvdtrain: error:" in text]
    # Every rank that got to print before the launcher ended the job printed
    # the same line, once (Gloo ends the others as soon as the first one exits).
    assert errors and len({rank for rank, _ in errors}) == len(errors), output[-2000:]
    assert len({text for _, text in errors}) == 1, output[-2000:]
    assert expected in errors[0][1]
    assert "Traceback" not in output, output[-2000:]
