"""A worker stops when the shell running its MPI launcher is killed (what
killing `horovodrun --mpi` does), with one line naming the launcher."""

import signal
import subprocess
import sys

from launch import REPO, environment

WORKER = """
import os, time
from hvdtrain.faults import launcher_watch
os.environ["PMI_RANK"] = "0"
launcher_watch.start(0)
print("watching", flush=True)
time.sleep(120)
"""


def test_a_worker_stops_when_the_shell_running_its_launcher_is_killed(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    # As under horovodrun --mpi: `sh -c "mpirun ..."`, and mpirun (here a
    # shell named so) starting the worker.
    mpirun = f"exec -a mpirun sh -c \"{sys.executable} {tmp_path / 'worker.py'}; :\""
    shell = subprocess.Popen(["sh", "-c", f"bash -c '{mpirun}'; :"], cwd=REPO,
                             env=environment(None), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert shell.stdout.readline() == "watching\n"
    shell.send_signal(signal.SIGKILL)
    _, stderr = shell.communicate(timeout=240)
    assert f"hvdtrain: error: rank 0: the launcher (pid {shell.pid}) is gone; stopping this " \
           "worker" in stderr, stderr
