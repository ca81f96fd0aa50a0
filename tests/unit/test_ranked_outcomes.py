"""How the ranks of a ranked launch agree on a test phase's outcome (tests/harness/outcomes.py)."""

from harness.outcomes import agreed


def report(outcome, message=None, duration=1.0):
    longrepr = None
    if outcome == "failed":
        longrepr = {"reprcrash": {"path": "t.py", "lineno": 3, "message": message},
                    "reprtraceback": {}, "sections": [],
                    "chain": [[{}, {"path": "t.py", "lineno": 3, "message": message}, None]]}
    elif outcome == "skipped":
        longrepr = ["t.py", 3, message]
    return {"outcome": outcome, "longrepr": longrepr, "sections": [], "duration": duration}


def test_passing_everywhere_passes_and_takes_the_slowest_ranks_time():
    merged = agreed([report("passed", duration=1.0), report("passed", duration=2.5)])
    assert merged["outcome"] == "passed" and merged["duration"] == 2.5
    assert merged["sections"] == []


def test_a_failure_on_one_rank_fails_with_that_ranks_report_naming_it():
    merged = agreed([report("passed"), report("failed", "AssertionError: x"), report("passed")])
    assert merged["outcome"] == "failed"
    assert merged["longrepr"]["reprcrash"]["message"] == "[rank 1] AssertionError: x"
    assert merged["longrepr"]["chain"][-1][1]["message"] == "[rank 1] AssertionError: x"
    assert merged["sections"] == [("ranks", "failed on rank 1; passed on ranks 0, 2")]


def test_ranks_failing_differently_are_each_named_once():
    merged = agreed([report("failed", "E: a"), report("failed", "E: b"), report("failed", "E: a")])
    assert merged["longrepr"]["reprcrash"]["message"] == "[rank 0] E: a"
    assert merged["sections"] == [("ranks", "failed on ranks 0, 1, 2\n"
                                            "rank 1 failed differently: E: b")]


def test_a_skip_on_some_ranks_only_fails():
    merged = agreed([report("skipped", "no GPU"), report("passed")])
    assert merged["outcome"] == "failed"
    assert merged["longrepr"] == ("skipped on rank 0 only (no GPU): a ranked test skips on every "
                                  "rank or on none")
    assert agreed([report("skipped", "no GPU")] * 2)["outcome"] == "skipped"
