"""The pytest plugin on each rank of a ranked launch.

Per test: rank 0 announces its start; after each phase (setup, call,
teardown) the ranks exchange their reports and every rank keeps the agreed
one (outcomes.py), so all take the same branch next (a setup failed on one
rank skips the call on all); rank 0 writes the agreed reports for the
dispatcher. A watchdog ends this rank when a test outlives its timeout,
leaving a note of where it stood (in the test, or waiting for named ranks)."""

import json
import os
import pathlib
import sys
import threading
import time
import traceback

import pytest

from harness import launches, outcomes, reports
from harness.rendezvous import Rendezvous

__all__ = ["RESULTS", "TIMED_OUT_STATUS", "RankPlugin", "timeout_note"]

RESULTS = "results.jsonl"
TIMED_OUT_STATUS = 3
# Frames of a timed-out rank's stack its note keeps (the innermost).
_STACK_FRAMES = 12


def timeout_note(workdir, rank):
    """Where rank `rank`'s watchdog leaves its note."""
    return pathlib.Path(workdir) / f"timeout.rank{rank}.json"


def _test_frames(frame):
    """The innermost frames of a stack, without pytest's own."""
    frames = [f for f in traceback.extract_stack(frame)
              if not any(part in f.filename for part in ("/_pytest/", "/pluggy/"))]
    return "".join(traceback.format_list(frames[-_STACK_FRAMES:]))


class _Watchdog:
    """Ends this process when the armed test outlives its deadline."""

    def __init__(self, on_timeout):
        self._on_timeout = on_timeout
        self._armed = threading.Condition()
        self._deadline = None
        threading.Thread(target=self._watch, name="ranked-test-watchdog", daemon=True).start()

    def arm(self, seconds):
        with self._armed:
            self._deadline = time.monotonic() + seconds
            self._armed.notify()

    def disarm(self):
        with self._armed:
            self._deadline = None
            self._armed.notify()

    def _watch(self):
        with self._armed:
            while True:
                if self._deadline is None:
                    self._armed.wait()
                elif time.monotonic() >= self._deadline:
                    self._on_timeout()
                else:
                    self._armed.wait(self._deadline - time.monotonic())


class RankPlugin:
    def __init__(self, workdir, rank, size, nodeids, stderr_fd):
        self.workdir = pathlib.Path(workdir)
        self.rank, self.size = rank, size
        self.nodeids = nodeids
        self.stderr_fd = stderr_fd   # the launch's stderr, outside pytest's capture
        self.rendezvous = Rendezvous(self.workdir / "rendezvous", rank, size)
        self.results = open(self.workdir / RESULTS, "a") if rank == 0 else None
        self.watchdog = _Watchdog(self._timed_out)
        self.seq = -1
        self.item = None
        self.phase = None
        self.timeout = None

    def pytest_configure(self, config):
        # pytest-timeout is off on the ranks (the watchdog ends a test that
        # hangs inside a collective, where a signal cannot): its marker stays.
        config.addinivalue_line("markers", "timeout(seconds): the test's timeout")
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        """Runs exactly the dispatcher's items in its order."""
        by_id = {item.nodeid: item for item in items}
        missing = [n for n in self.nodeids if n not in by_id]
        if missing:
            raise pytest.UsageError(f"rank {self.rank} did not collect {missing[:3]}")
        items[:] = [by_id[n] for n in self.nodeids]

    def _write(self, event):
        if self.results is not None:
            self.results.write(json.dumps(event) + "\n")
            self.results.flush()

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.seq += 1
        self.item = item
        self.timeout = launches.timeout(item)
        self._write({"event": "start", "nodeid": item.nodeid, "seq": self.seq,
                     "timeout": self.timeout})
        self.watchdog.arm(self.timeout)
        yield
        self.watchdog.disarm()
        self.item = None

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.phase = "setup"
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        self.phase = "call"
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem):
        self.phase = "teardown"
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        mine = reports.to_json(self.config, outcome.get_result())
        everyone = self.rendezvous.exchange(f"{self.seq:05d}-{call.when}",
                                            {"nodeid": item.nodeid, "report": mine})
        strays = {r["nodeid"] for r in everyone} - {item.nodeid}
        merged = outcomes.agreed([r["report"] for r in everyone])
        if strays:
            merged.update(outcome="failed", longrepr=(
                f"the ranks ran different tests at #{self.seq}: {item.nodeid} and "
                f"{sorted(strays)}"))
        outcome.force_result(reports.from_json(self.config, merged))

    def pytest_runtest_logreport(self, report):
        self._write({"event": "report", "report": reports.to_json(self.config, report)})

    def pytest_sessionfinish(self):
        self._write({"event": "finished"})

    def _timed_out(self):
        key = self.rendezvous.waiting_at
        main = sys._current_frames()[threading.main_thread().ident]
        note = {"nodeid": self.item.nodeid if self.item else None, "rank": self.rank,
                "phase": self.phase, "seconds": self.timeout, "waiting": key is not None,
                "missing": self.rendezvous.missing(key) if key else [self.rank],
                "stack": _test_frames(main)}
        path = timeout_note(self.workdir, self.rank)
        path.with_suffix(".partial").write_text(json.dumps(note))
        os.replace(path.with_suffix(".partial"), path)
        os.write(self.stderr_fd, (f"ranked test {note['nodeid']} timed out after "
                                  f"{self.timeout:.0f} s on rank {self.rank}, at:\n"
                                  f"{note['stack']}").encode())
        os._exit(TIMED_OUT_STATUS)
