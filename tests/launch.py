"""Helpers to run hvdtrain as users do: as a command, alone or under
horovodrun, or in the test's own process."""

import dataclasses
import os
import pathlib
import re
import runpy
import signal
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"


# What a launcher tells the processes it starts, and what a rank of a ranked
# launch (tests/ranked) sets for its own Horovod (the harness, hvdtrain.init):
# a command the tests start from such a rank must not take it for its own.
_LAUNCH_VARIABLES = re.compile(
    r"^(HOROVOD_((LOCAL_|CROSS_)?(RANK|SIZE)|HOSTNAME|GLOO_\w+|CONTROLLER|CPU_OPERATIONS"
    r"|DYNAMIC_PROCESS_SETS|TIMELINE|STALL_\w+)|OMPI_\w+|PMIX_\w+|PMI_\w+|OPAL_\w+"
    r"|PRTE_\w+)$")


def environment(extra):
    env = {k: v for k, v in os.environ.items() if not _LAUNCH_VARIABLES.match(k)}
    env.update(extra or {})
    # Two processes share the machine's cores; keep BLAS pools from oversubscribing.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def run(args, timeout=240, cwd=REPO, env=None):
    """Runs a command to completion (`env`: variables to add); a hang fails
    the test at `timeout`."""
    return subprocess.run([str(a) for a in args], cwd=cwd, env=environment(env),
                          capture_output=True, text=True, timeout=timeout)


def horovodrun(args, np=2, controller="gloo", timeout=240, cwd=REPO, env=None):
    """Runs `args` as `np` Horovod processes on this host."""
    return run(["horovodrun", "-np", np, "-H", f"localhost:{np}", f"--{controller}", *args],
               timeout=timeout, cwd=cwd, env=env)


def worker(name):
    return [sys.executable, WORKERS / f"{name}.py"]


# horovodrun prefixes each rank's lines: "[1]<stderr>:" (Gloo), "[1,1]<stderr>:" (MPI).
_RANK_TAG = r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:"
_RANK_LINE = re.compile(rf"^{_RANK_TAG}(.*)$", re.MULTILINE)


def rank_lines(output):
    """(rank, text) for each line a rank printed under horovodrun. mpirun
    tags every write, so a line written in pieces (Python's traceback, an
    unbuffered print) carries tags inside it too: those are dropped."""
    return [(int(rank), re.sub(_RANK_TAG, "", text)) for rank, text in _RANK_LINE.findall(output)]


# The signals tests send to what they start.
_SENT = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def start(command, log, env=None):
    """Starts `command` in the background, its output going to the file
    `log`; returns the process. The signals tests send are at their default
    actions there, as in a terminal's command: a suite started in the
    background (`&`, nohup) inherits SIGINT or SIGHUP ignored, and a launcher
    keeps them so (a test's signal would do nothing)."""
    with open(log, "w") as out:
        return subprocess.Popen([str(a) for a in command], cwd=REPO, env=environment(env),
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_default_signals)


def _default_signals():
    for sent in _SENT:
        signal.signal(sent, signal.SIG_DFL)


def start_horovodrun(args, log, np=2, controller="gloo", env=None):
    """Starts `args` as `np` Horovod processes in the background, their
    output going to the file `log`; returns the horovodrun process."""
    return start(["horovodrun", "-np", np, "-H", f"localhost:{np}", f"--{controller}", *args],
                 log, env)


def running(marker):
    """The pids of the processes running whose command line holds `marker`
    (a rank, or the mpirun left writing their output after horovodrun's
    shell died)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


def rank_pid(rank, marker):
    """The pid of Horovod rank `rank` among the processes whose command line
    contains `marker`."""
    for pid in running(marker):
        try:
            environ = dict(line.split("=", 1) for line in pathlib.Path(f"/proc/{pid}/environ")
                           .read_bytes().decode(errors="replace").split("\0") if "=" in line)
        except (OSError, ValueError):
            continue
        if environ.get("HOROVOD_RANK", environ.get("OMPI_COMM_WORLD_RANK")) == str(rank):
            return pid
    raise LookupError(f"no rank {rank} running with {marker}")


def wait_until(condition, timeout, interval=0.002):
    """Polls `condition()` until it is true; False if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


@dataclasses.dataclass(frozen=True)
class Finished:
    """How an in-process `hvdtrain` command ended."""
    status: int
    stdout: str
    stderr: str

    @property
    def output(self):
        return self.stdout + self.stderr


def hvdtrain_command(capfd, *args, script=None):
    """Runs `hvdtrain ARGS` in this process (on a rank of a ranked launch, as
    `horovodrun ... hvdtrain ARGS` runs it on that rank): flags parsed
    afresh, its exit caught, its output (of Python and of TensorFlow's and
    Horovod's C++) captured by `capfd`. With `script` (e.g.
    "recipes/wide_and_deep.py"): `python SCRIPT ARGS` instead."""
    from absl import flags

    from hvdtrain import cli

    capfd.readouterr()
    flags.FLAGS.unparse_flags()
    argv = sys.argv
    try:
        if script is None:
            cli.run(["hvdtrain", *map(str, args)])
        else:
            sys.argv = [str(script), *map(str, args)]
            runpy.run_path(str(script), run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        sys.argv = argv
        flags.FLAGS.unparse_flags()   # as a process would leave them: unread
    out, err = capfd.readouterr()
    return Finished(status, out, err)
