"""Helpers to run hvdtrain as users do: as a command, alone or under horovodrun."""

import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "parallel" / "workers"


def _env(extra):
    env = dict(os.environ, **(extra or {}))
    # Two processes share the machine's cores; keep BLAS pools from oversubscribing.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def run(args, timeout=240, cwd=REPO, env=None):
    """Runs a command to completion (`env`: variables to add); a hang fails
    the test at `timeout`."""
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(env), capture_output=True,
                          text=True, timeout=timeout)


def horovodrun(args, np=2, controller="gloo", timeout=240, cwd=REPO, env=None):
    """Runs `args` as `np` Horovod processes on this host."""
    return run(["horovodrun", "-np", np, "-H", f"localhost:{np}", f"--{controller}", *args],
               timeout=timeout, cwd=cwd, env=env)


def worker(name):
    return [sys.executable, WORKERS / f"{name}.py"]


# horovodrun prefixes each rank's lines: "[1]<stderr>:" (Gloo), "[1,1]<stderr>:" (MPI).
_RANK_LINE = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:(.*)$", re.MULTILINE)


def rank_lines(output):
    """(rank, text) for each line a rank printed under horovodrun."""
    return [(int(rank), text) for rank, text in _RANK_LINE.findall(output)]
