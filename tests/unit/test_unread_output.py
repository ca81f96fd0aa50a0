"""A worker whose launcher stopped reading its stdout and stderr (died) goes
on: its writes are discarded instead of raising BrokenPipeError."""

import subprocess
import sys

import pytest

from launch import REPO, environment

WORKER = """
import sys
from hvdtrain.faults import broken_pipes
if sys.argv[1] == "guarded":
    broken_pipes.install()
sys.stdin.read()                         # until the reader is gone
for line in range(2000):                 # more than a pipe holds
    print(f"step {{line}}", end="\\r" if line % 2 else "\\n")
    sys.stdout.flush()
broken_pipes.say("a signal handler's line\\n")   # unbuffered, as a signal handler writes
sys.stderr.write("a log line\\n")
open({done!r}, "w").write("went on")
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_writes_to_a_closed_pipe_do_not_end_the_worker(tmp_path, guarded):
    done = tmp_path / "done"
    (tmp_path / "worker.py").write_text(WORKER.format(done=str(done)))
    worker = subprocess.Popen(
        [sys.executable, tmp_path / "worker.py", "guarded" if guarded else "bare"], cwd=REPO,
        env=environment(None), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    worker.stdout.close()
    worker.stderr.close()
    worker.stdin.close()
    status = worker.wait(timeout=60)
    # Unguarded, the first write raises, as it did in training (the control).
    assert (status, done.exists()) == ((0, True) if guarded else (1, False))
