"""The harness of the ranked tests (tests/harness), run on tests planted for
it (tests/harness/planted): a failure on one rank fails that test on every
rank, its message shown once, and the next test runs; a hang ends the launch
at the test's timeout, naming the test and the rank that did not arrive, and
a new launch runs the tests after it.
Own launches: the harness is what starts ranked launches (a pytest session
of its own, whose failures are the point)."""

import re
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from launch import REPO, run

PLANTED = REPO / "tests" / "harness" / "planted"
# Four launches, one a hang of 5 s: about a minute and a half on a quiet
# 2-core machine; more while other work loads it.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted session's output, and {test id: (outcome, what the session
    printed of its failure)}. It runs on two xdist workers, as make test does:
    a worker's launches report to the session through xdist."""
    junit = tmp_path_factory.mktemp("planted") / "junit.xml"
    result = run([sys.executable, "-m", "pytest", PLANTED, "-o", "python_files=planted_*.py",
                  "-p", "no:cacheprovider", "-n", "2", f"--junitxml={junit}"], timeout=840,
                 env={"COLUMNS": "200"})   # the summary lines whole
    # pytest prints each failure under a "____ name ____" heading.
    printed = dict(re.findall(r"^_+ (\S+) _+\n(.*?)(?=^_+ \S+ _+$|^=+ )", result.stdout,
                              re.M | re.S))
    cases = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("name")
        failed = case.find("failure") is not None
        cases[name] = ("failed", printed[name]) if failed else ("passed", "")
    return result, cases


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_failure_on_one_rank_fails_the_test_on_every_rank_and_the_next_test_runs(
        planted, controller):
    result, cases = planted
    assert result.returncode == 1, result.stdout[-3000:]
    outcome, report = cases[f"test_fails_on_rank_1_only[{controller}]"]
    assert outcome == "failed"
    assert "failed on rank 1; passed on rank 0" in report, report
    # Rank 1's report once (rank 0 passed: nothing of its own to show).
    assert report.count("E       AssertionError: planted failure on rank 1") == 1, report
    assert re.search(rf"FAILED \S+test_fails_on_rank_1_only\[{controller}\] - \[rank 1\] "
                     r"AssertionError: planted failure on rank 1", result.stdout)
    for name in ("test_passes_on_every_rank", "test_after_the_failure_collectives_pair_up"):
        assert cases[f"{name}[{controller}]"][0] == "passed", cases[f"{name}[{controller}]"]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_hang_ends_the_launch_naming_the_rank_and_a_new_launch_goes_on(planted, controller):
    result, cases = planted
    outcome, report = cases[f"test_hangs_on_rank_0[{controller}]"]
    assert outcome == "failed"
    assert (f"timed out after 5 s in launch {controller}: rank 0 did not arrive at the end of "
            "the test's call (rank 1 waited there)") in report, report
    # Where rank 0 was: the collective that rank 1 never made.
    assert re.search(r"rank 0 was at:\n.*in test_hangs_on_rank_0\n\s+hvd\.allreduce\(.*"
                     r"name=\"planted\.only_rank_0_calls_this\"\)", report, re.S), report
    assert cases[f"test_after_the_hang_a_new_launch_goes_on[{controller}]"][0] == "passed"
    assert f"{controller}: 5 tests on horovodrun -np 2 --{controller} in 2 runs" in result.stdout
