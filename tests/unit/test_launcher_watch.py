"""A worker stops when the launcher above its MPI launcher is killed (what
killing `horovodrun --mpi` does), with one line naming the launcher."""

import signal
import subprocess
import sys

import pytest

from launch import REPO, environment

WORKER = """
import os, time
from hvdtrain.faults import launcher_watch
os.environ["PMI_RANK"] = "0"
launcher_watch.start(0)
print("watching", flush=True)
time.sleep(120)
"""
# The worker under an mpirun (here a shell named so), as `horovodrun --mpi` runs it.
MPIRUN = "exec -a mpirun sh -c \"{python} {worker}; :\""
# horovodrun (a Python script) runs mpirun as its child; Horovod's own
# horovodrun replaces itself with `sh -c "mpirun ..."`.
LAUNCHERS = {
    "horovodrun": lambda tmp_path, mpirun: [sys.executable, _script(
        tmp_path / "horovodrun", f"import subprocess\nsubprocess.run(['bash', '-c', {mpirun!r}])")],
    "sh -c": lambda tmp_path, mpirun: ["sh", "-c", f"bash -c '{mpirun}'; :"],
}


def _script(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_worker_stops_when_the_launcher_of_its_mpirun_is_killed(tmp_path, launcher):
    (tmp_path / "worker.py").write_text(WORKER)
    mpirun = MPIRUN.format(python=sys.executable, worker=tmp_path / "worker.py")
    job = subprocess.Popen(LAUNCHERS[launcher](tmp_path, mpirun), cwd=REPO,
                           env=environment(None), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert job.stdout.readline() == "watching\n"
    job.send_signal(signal.SIGKILL)
    _, stderr = job.communicate(timeout=240)
    assert f"hvdtrain: error: rank 0: the launcher (pid {job.pid}) is gone; stopping this " \
           "worker" in stderr, stderr
