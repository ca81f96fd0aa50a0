"""What the ranks agree a test phase's outcome is, from each rank's report
(as pytest serializes it): a failure on any rank fails it everywhere,
showing the first failing rank's report once and naming the ranks."""

import copy

__all__ = ["agreed"]


def _crash(report):
    """The one-line message of a failed report."""
    longrepr = report["longrepr"]
    if isinstance(longrepr, dict):
        return (longrepr.get("reprcrash") or {}).get("message", "").split("\n")[0]
    return str(longrepr).strip().split("\n")[-1]


def _ranks(ranks):
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def _prefix_crash(report, prefix):
    """Puts `prefix` before the message of pytest's short summary line."""
    longrepr = report["longrepr"]
    if isinstance(longrepr, dict):
        crashes = [longrepr.get("reprcrash")] + [longrepr["chain"][-1][1]
                                                 if longrepr.get("chain") else None]
        for crash in filter(None, crashes):
            crash["message"] = prefix + crash["message"]
    elif isinstance(longrepr, str):
        report["longrepr"] = prefix + longrepr


def agreed(reports):
    """The report every rank keeps for one phase, from `reports` (one per
    rank, in rank order, each `pytest_report_to_serializable`'s dict)."""
    outcomes = [r["outcome"] for r in reports]
    failed = [rank for rank, outcome in enumerate(outcomes) if outcome == "failed"]
    if failed:
        first = failed[0]
        merged = copy.deepcopy(reports[first])
        _prefix_crash(merged, f"[rank {first}] ")
        others = [r for r in range(len(reports)) if r not in failed]
        lines = [f"failed on {_ranks(failed)}"
                 + (f"; {outcomes[others[0]]} on {_ranks(others)}" if others else "")]
        lines += [f"rank {r} failed differently: {_crash(reports[r])}" for r in failed[1:]
                  if _crash(reports[r]) != _crash(reports[first])]
        merged["sections"].append(("ranks", "\n".join(lines)))
    elif len(set(outcomes)) == 1:
        merged = copy.deepcopy(reports[0])
    else:   # passed on some ranks, skipped on others
        skipped = [rank for rank, outcome in enumerate(outcomes) if outcome == "skipped"]
        merged = copy.deepcopy(reports[skipped[0]])
        reason = merged["longrepr"][-1] if isinstance(merged["longrepr"], list) else ""
        merged["outcome"] = "failed"
        merged["longrepr"] = (f"skipped on {_ranks(skipped)} only ({reason}): a ranked test "
                              "skips on every rank or on none")
    merged["duration"] = max(r["duration"] for r in reports)
    return merged
