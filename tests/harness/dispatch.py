"""The dispatcher: the pytest plugin of the session a developer starts.

Ranked test cases (tests/ranked: parametrized by a `launch`, see
launches.py) are grouped by launch. At a group's first case the dispatcher
starts one `horovodrun` for all the group's cases (rank_main.py) and then
reports each case from what rank 0 writes, as pytest would have: outcome,
captured output, durations. A launch that ends early (a test timed out or a
rank died) fails the case it was in, naming what the ranks left behind,
and a new launch takes the cases after it."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from _pytest.reports import TestReport

from harness import launches
from harness.fixtures import SESSION_DIR
from harness.rank_plugin import RESULTS, timeout_note
from harness.reports import from_json

__all__ = ["CompleteLines", "Dispatcher"]

REPO = pathlib.Path(__file__).resolve().parents[2]
RANK_MAIN = pathlib.Path(__file__).with_name("rank_main.py")
# Seconds a launch may take to start its first test (importing TensorFlow,
# Horovod's rendezvous, collecting the tests) before it is given up.
STARTUP_SECONDS = 240
# Seconds past a test's timeout before the dispatcher ends a launch whose
# ranks did not end themselves (their watchdogs do, at the timeout).
GRACE_SECONDS = 60
_LOG_TAIL = 4000
# Where an xdist worker's summary travels to the session it is part of.
_SUMMARY = "ranked_launches"


def _tail(path):
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL:]
    except OSError:
        return ""


class CompleteLines:
    """The lines another process appends to a file, each once it is whole:
    a long line reaches the file in several writes, and a read can fall
    between them."""

    def __init__(self, path):
        path.touch()
        self._file = open(path)
        self._unfinished = ""

    def new(self):
        *lines, self._unfinished = (self._unfinished + self._file.read()).split("\n")
        return lines

    def close(self):
        self._file.close()


class _Run:
    """One horovodrun over `items` (a launch's remaining cases)."""

    def __init__(self, launch, items, timeouts, session_dir):
        self.launch, self.items, self.timeouts = launch, items, timeouts
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"hvdtrain-ranked-{launch}-"))
        (self.workdir / "items.txt").write_text("\n".join(i.nodeid for i in items) + "\n")
        self.log = self.workdir / "launch.log"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   **{SESSION_DIR: str(session_dir)})
        env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                ["horovodrun", "-np", str(launch.np), "-H", f"localhost:{launch.np}",
                 f"--{launch.controller}", sys.executable, str(RANK_MAIN), str(self.workdir)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()
        self.results = CompleteLines(self.workdir / RESULTS)
        self.reports = {}        # nodeid -> [reports]
        self.started = {}        # nodeid -> when rank 0 started it (monotonic)
        self.finished = False
        self.returncode = None

    def _read(self, config):
        for line in self.results.new():
            event = json.loads(line)
            if event["event"] == "start":
                self.started[event["nodeid"]] = time.monotonic()
            elif event["event"] == "report":
                report = from_json(config, event["report"])
                self.reports.setdefault(report.nodeid, []).append(report)
            elif event["event"] == "finished":
                self.finished = True

    def _deadline(self, item):
        if item.nodeid in self.started:
            return self.started[item.nodeid] + self.timeouts[item.nodeid] + GRACE_SECONDS
        latest = max(self.started.values(), default=None)
        if latest is None:
            return self.started_at + STARTUP_SECONDS
        # Waiting for the test before it to end.
        return latest + max(self.timeouts.values()) + GRACE_SECONDS

    def wait_for(self, item):
        """The item's reports; None if the launch ended (or was ended) first."""
        while True:
            self._read(item.config)
            reports = self.reports.get(item.nodeid, [])
            if reports and reports[-1].when == "teardown":
                return reports
            if self.process.poll() is not None:
                self._read(item.config)
                reports = self.reports.get(item.nodeid, [])
                return reports if reports and reports[-1].when == "teardown" else None
            if time.monotonic() > self._deadline(item):
                self.stop()
            time.sleep(0.02)

    def stop(self):
        """Ends the launch: horovodrun passes SIGTERM on to its ranks; then
        whatever is left of its process group is killed."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def end(self):
        """Waits for horovodrun to exit after its last test (ending it if it
        does not); its status."""
        try:
            self.process.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.stop()
        self.results.close()
        return self.process.returncode

    def why_it_ended(self, item):
        """What the launch left behind about `item`, which it never finished."""
        notes = []
        for rank in range(self.launch.np):
            path = timeout_note(self.workdir, rank)
            if path.exists():
                notes.append(json.loads(path.read_text()))
        if notes:
            seconds = notes[0]["seconds"]
            stuck = sorted({r for note in notes for r in note["missing"]})
            waiting = sorted(note["rank"] for note in notes if note["waiting"])
            inside = [note for note in notes if not note["waiting"]]
            phase = (inside or notes)[0]["phase"]
            text = (f"timed out after {seconds:.0f} s in launch {self.launch}: "
                    f"rank{'s' * (len(stuck) > 1)} {', '.join(map(str, stuck))} did not "
                    f"arrive at the end of the test's {phase}")
            if waiting:
                text += (f" (rank{'s' * (len(waiting) > 1)} {', '.join(map(str, waiting))} "
                         "waited there)")
            for note in inside:
                text += f"\nrank {note['rank']} was at:\n{note['stack']}"
            return f"{text}\n(the launch's output: {self.log})"
        if item.nodeid in self.started:
            text = (f"launch {self.launch} ended during this test (horovodrun's status "
                    f"{self.process.returncode})")
        else:
            text = (f"launch {self.launch} ended before this test started (horovodrun's "
                    f"status {self.process.returncode})")
        return f"{text}; its output ({self.log}) ends with:\n{_tail(self.log)}"

    def made_progress(self):
        return bool(self.started)

    def clean_up(self):
        shutil.rmtree(self.workdir, ignore_errors=True)


def _failed(item, longrepr, when="call"):
    return TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
                      longrepr, when, duration=0.0)


class Dispatcher:
    def __init__(self):
        self.groups = {}      # launch -> its items, in run order
        self.timeouts = {}    # nodeid -> seconds
        self.not_run = {}     # nodeid -> why
        self.run = None
        self.spent = {}       # launch -> [seconds of each of its horovodruns]
        self.kept = []        # work directories of launches that failed
        self.session_dir = None   # what launches share (made at the first)
        self.workers_summaries = []   # under xdist: the workers' _summary() lines

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        """Runs each launch's cases one after the other, before the other
        tests (the longest unit of work first; under xdist all on one
        worker, see scheduling.py: two launches in flight together would
        both wait on the other's ranks for the cores).
        Leaves out the cases whose parameter set's mark excludes their
        launch, and with --ranked-np=N the launches of another size."""
        size = config.getoption("--ranked-np", None)
        other = {i for i in items if launches.of_item(i) and (
            not launches.wanted(i) or size is not None and launches.of_item(i).np != size)}
        if other:
            config.hook.pytest_deselected(items=list(other))
            items[:] = [i for i in items if i not in other]
        ranked = [item for item in items if launches.of_item(item)]
        if not ranked:
            return
        for item in ranked:
            self.groups.setdefault(launches.of_item(item), []).append(item)
            self.timeouts[item.nodeid] = launches.timeout(item)
            # The ranks time the test; pytest-timeout here would time the wait.
            item.add_marker(pytest.mark.timeout(0), append=False)
        rest = [item for item in items if not launches.of_item(item)]
        items[:] = [i for group in self.groups.values() for i in group] + rest

    def _run_for(self, launch, item):
        if self.run is not None and item not in self.run.items:
            self._end_run()
        if self.run is None:
            group = self.groups[launch]
            if self.session_dir is None:
                self.session_dir = pathlib.Path(tempfile.mkdtemp(prefix="hvdtrain-ranked-session-"))
            self.run = _Run(launch, group[group.index(item):], self.timeouts, self.session_dir)
        return self.run

    def _end_run(self, broken=False):
        run, self.run = self.run, None
        if broken:
            run.stop()
        status = run.end()
        self.spent.setdefault(run.launch, []).append(time.monotonic() - run.started_at)
        if status == 0:
            run.clean_up()
        else:
            self.kept.append(run.workdir)
        return status

    def _reports(self, item, launch):
        if item.nodeid in self.not_run:
            return [_failed(item, self.not_run[item.nodeid])]
        run = self._run_for(launch, item)
        reports = run.wait_for(item)
        if reports is None:
            reports = [_failed(item, run.why_it_ended(item))]
            if not run.made_progress():
                # Nothing ran: a new launch would end the same way.
                for other in run.items[run.items.index(item) + 1:]:
                    self.not_run[other.nodeid] = (f"not run: launch {launch} ended before its "
                                                  f"first test (see {item.nodeid})")
            self._end_run(broken=True)
        elif item is run.items[-1]:
            status = self._end_run()
            if status != 0 and all(r.outcome != "failed" for r in reports):
                reports[-1] = _failed(item, f"launch {launch} exited with status {status} after "
                                            f"its last test; its output ends with:\n"
                                            f"{_tail(run.log)}", when="teardown")
        return reports

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        launch = launches.of_item(item)
        if launch is None:
            return None
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in self._reports(item, launch):
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _summary(self):
        """Each launch's tests and time, and the work directories kept."""
        lines = []
        for launch, seconds in self.spent.items():
            runs = f" in {len(seconds)} runs" if len(seconds) > 1 else ""
            lines.append(f"{launch}: {len(self.groups[launch])} tests on horovodrun -np "
                         f"{launch.np} --{launch.controller}{runs}, {sum(seconds):.1f} s")
        return lines + [f"kept for inspection: {workdir}" for workdir in self.kept]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """(xdist) A worker's launches, for the summary of the session it is part of."""
        self.workers_summaries.extend(getattr(node, "workeroutput", {}).get(_SUMMARY, []))

    def pytest_terminal_summary(self, terminalreporter):
        lines = self._summary() + self.workers_summaries
        if lines:
            terminalreporter.section("ranked launches")
            for line in lines:
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session):
        if self.run is not None:   # interrupted
            self._end_run(broken=True)
        if self.session_dir is not None:
            shutil.rmtree(self.session_dir, ignore_errors=True)
        if hasattr(session.config, "workeroutput"):   # an xdist worker: the session's summary
            session.config.workeroutput[_SUMMARY] = self._summary()
