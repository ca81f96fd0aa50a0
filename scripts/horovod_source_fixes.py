"""Fixes to Horovod 0.28.1's source for the TensorFlow hvdtrain pins, applied
to an unpacked sdist before it is built:

    python scripts/horovod_source_fixes.py SOURCE_DIR

Each fix replaces one exact passage. A passage already replaced is left alone
(running twice changes nothing); a passage found neither way means the source
is not the one these fixes were written for, and the build stops there, naming
the fix, instead of compiling something nobody checked.
"""

import pathlib
import sys

# (file, what it fixes, the passage as released, the passage fixed)
FIXES = [
    ("horovod/tensorflow/xla_mpi_ops.cc",
     # GPU builds only (the file's body is under HAVE_GPU). XLA dropped its
     # xla::StatusOr alias of absl::StatusOr (gone in TensorFlow 2.21); the
     # absl name compiles against every TensorFlow that had the alias too.
     "xla::StatusOr -> absl::StatusOr (TensorFlow 2.21's XLA)",
     "::xla::StatusOr<::xla::XlaOp>",
     "absl::StatusOr<::xla::XlaOp>"),
    ("horovod/tensorflow/mpi_ops.cc",
     # GPU builds only. Horovod declares stream_executor::gpu::AsGpuStreamValue
     # and leaves it to libtensorflow_framework, which no longer exports it in
     # TensorFlow 2.21: the library then links but fails to load with an
     # undefined symbol. From 2.21 on it is defined here, as TensorFlow's own
     # inline helper does; older TensorFlow keeps its exported one.
     "define AsGpuStreamValue (no longer exported by TensorFlow 2.21)",
     """// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
""",
     """#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
namespace stream_executor {
namespace gpu {
#if TENSORFLOW_VERSION >= 2021000000
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
#else
GpuStreamHandle AsGpuStreamValue(Stream* stream);
#endif // TENSORFLOW_VERSION >= 2021000000
} // namespace gpu
} // namespace stream_executor
"""),
    ("horovod/common/timeline.cc",
     # The timeline's writer thread waits for records by yielding in a loop,
     # and a yield returns at once on a CPU with nothing else queued: the
     # coordinator spins a whole core from hvd.init on, whenever
     # HOROVOD_TIMELINE is set (DYNAMIC included, with no timeline started).
     # Records wait in a queue of a million; a millisecond's sleep loses none.
     "timeline: the writer sleeps between records instead of spinning a core",
     """    // Allow scheduler to schedule other work for this core.
    std::this_thread::yield();
""",
     """    // Wait for records without spinning a core.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
"""),
    ("horovod/common/tensor_queue.h",
     # The background thread waits for work instead of cycling while idle
     # (operations.cc, below): how it learns of work...
     "idle wait: work arriving is announced",
     """namespace horovod {
namespace common {

class TensorQueue {
""",
     """namespace horovod {
namespace common {

// Work enqueued in any process set's queue, or a shutdown: a count that each
// announcement raises, and a wait (at most `timeout`) until it differs from
// the count `seen` that was read before looking at the queues.
uint64_t WorkCount();
void NotifyWork();
void WaitForWorkAfter(uint64_t seen, std::chrono::milliseconds timeout);

class TensorQueue {
"""),
    ("horovod/common/tensor_queue.h",
     "idle wait: a queue tells it holds no tensor",
     """  void RemoveJoinTensor();

protected:
""",
     """  void RemoveJoinTensor();

  // No tensor of this process waits in this queue for its collective.
  bool IsIdle() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return tensor_table_.empty() && message_queue_.empty();
  }

protected:
"""),
    ("horovod/common/tensor_queue.h",
     "idle wait: the headers it needs",
     """#include <queue>

#include "common.h"
""",
     """#include <queue>
#include <chrono>
#include <condition_variable>

#include "common.h"
"""),
    ("horovod/common/tensor_queue.cc",
     "idle wait: the announcement",
     """namespace common {

// Add a TensorTableEntry""",
     """namespace common {

namespace {
std::mutex work_mutex;
std::condition_variable work_arrived;
uint64_t work_count = 0;
} // namespace

uint64_t WorkCount() {
  std::lock_guard<std::mutex> guard(work_mutex);
  return work_count;
}

void NotifyWork() {
  {
    std::lock_guard<std::mutex> guard(work_mutex);
    ++work_count;
  }
  work_arrived.notify_all();
}

void WaitForWorkAfter(uint64_t seen, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(work_mutex);
  work_arrived.wait_for(lock, timeout, [seen] { return work_count != seen; });
}

// Add a TensorTableEntry"""),
    ("horovod/common/tensor_queue.cc",
     "idle wait: a tensor enqueued is announced",
     """  tensor_table_.emplace(e.tensor_name, std::move(e));
  message_queue_.push(std::move(message));
  return Status::OK();
""",
     """  tensor_table_.emplace(e.tensor_name, std::move(e));
  message_queue_.push(std::move(message));
  NotifyWork();
  return Status::OK();
"""),
    ("horovod/common/tensor_queue.cc",
     "idle wait: a group of tensors enqueued is announced",
     """    message_queue_.push(std::move(messages[i]));
  }
  return Status::OK();
""",
     """    message_queue_.push(std::move(messages[i]));
  }
  NotifyWork();
  return Status::OK();
"""),
    ("horovod/common/operations.cc",
     # Every cycle time (1 ms by default) the background thread coordinates
     # with the other processes, work or not: under Gloo each such cycle is an
     # allreduce over TCP, two thread wake-ups per process, taken from the
     # compute threads of a CPU host that has no core to spare. While none of
     # a process's tensors waits for a collective, no other process needs its
     # cycles either (every collective needs every process's own request, and
     # enqueueing that request wakes it), so it waits for work instead,
     # cycling at least every 100 ms so that another process's shutdown and
     # the stall checks still come through. Process sets that change at run
     # time are registered outside the queues: with them it cycles as before.
     "background thread: waits for work instead of cycling while idle",
     """bool RunLoopOnce(HorovodGlobalState& state) {
  // This delay determines thread frequency and communication message latency
""",
     """void WaitWhileIdle(HorovodGlobalState& state) {
  if (state.dynamic_process_sets) {
    return;
  }
  auto seen = WorkCount();
  if (state.shut_down) {
    return;
  }
  for (auto id : state.process_set_table.Ids()) {
    if (!state.process_set_table.Get(id).tensor_queue.IsIdle()) {
      return;
    }
  }
  WaitForWorkAfter(seen, std::chrono::milliseconds(100));
}

bool RunLoopOnce(HorovodGlobalState& state) {
  WaitWhileIdle(state);
  // This delay determines thread frequency and communication message latency
"""),
    ("horovod/common/operations.cc",
     "background thread: a shutdown ends its wait for work",
     """    horovod_global.shut_down = true;
    horovod_global.background_thread.join();
""",
     """    horovod_global.shut_down = true;
    NotifyWork();
    horovod_global.background_thread.join();
"""),
    ("horovod/common/util.py",
     # horovodrun asks whether its extension was built with Gloo or MPI by
     # importing it (and so TensorFlow) in a new process: about 4 s of every
     # launch's start, for an answer its build fixed. The answers to the
     # "built ..." questions are kept beside the extension's library, valid
     # while that library is the same file; what depends on the machine (a
     # GPU present) is still asked each time. This passage answers from them...
     "horovodrun: what the extension was built with, answered from what is known",
     """        queue.put(result)

    # 'fork' is required because horovodrun is a frozen executable
""",
     """        queue.put(result)

    facts = _build_facts(ext_base_name) if fn_desc.startswith('built') else None
    if facts is not None and fn_desc in facts['answers']:
        return facts['answers'][fn_desc]
    # 'fork' is required because horovodrun is a frozen executable
"""),
    ("horovod/common/util.py",
     # ... and this one keeps a new answer.
     "horovodrun: what the extension was built with, kept once found",
     """    p.join()
    return queue.get_nowait()
""",
     """    p.join()
    result = queue.get_nowait()
    if facts is not None and result is not None:
        facts['answers'][fn_desc] = result
        _keep_build_facts(facts)
    return result


_BUILD_FACTS = '.build_facts.json'


def _build_facts(ext_base_name):
    \"\"\"What is known of how extension `ext_base_name` was built: its
    library's identity and the answers found so far; None without a library.\"\"\"
    import glob
    import importlib.util
    import json
    spec = importlib.util.find_spec('horovod.' + ext_base_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    libraries = sorted(glob.glob(os.path.join(folder, 'mpi_lib*.so')))
    if not libraries:
        return None
    stat = os.stat(libraries[0])
    identity = [os.path.basename(libraries[0]), stat.st_size, stat.st_mtime_ns]
    path = os.path.join(folder, _BUILD_FACTS)
    try:
        with open(path) as f:
            kept = json.load(f)
        if kept['library'] == identity:
            return dict(kept, path=path)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return dict(library=identity, answers={}, path=path)


def _keep_build_facts(facts):
    import json
    import tempfile
    folder = os.path.dirname(facts['path'])
    try:
        with tempfile.NamedTemporaryFile('w', dir=folder, delete=False) as f:
            json.dump(dict(library=facts['library'], answers=facts['answers']), f)
        os.chmod(f.name, 0o644)   # read by every user of the installation
        os.replace(f.name, facts['path'])
    except OSError:
        pass   # a read-only installation: asked again at the next launch
"""),
    ("horovod/runner/gloo_run.py",
     # horovodrun --gloo raises when a worker fails: a 20-line traceback after
     # the worker's own one-line error, and status 1 whatever the worker's
     # (2 for bad input, 200 for a preemption to requeue). mpirun exits with
     # the first failing worker's status; so does horovodrun now, after one
     # line naming it. The exception stays a RuntimeError for horovod.run().
     "horovodrun --gloo: the first failing worker, in one line and its status",
     """            raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
                               'status, thus causing the job to be terminated. The first process '
                               'to do so was:\\nProcess name: {name}\\nExit code: {code}\\n'
                               .format(name=name, code=exit_code))


def _get_min_start_hosts(settings):
""",
     """            raise WorkerFailed(name, exit_code)


class WorkerFailed(RuntimeError):
    \"\"\"The first worker to exit non-zero (its rank) and the status it exited with.\"\"\"

    def __init__(self, rank, exit_code):
        super().__init__(f'horovodrun: rank {rank} exited with status {exit_code}')
        self.exit_code = exit_code


def _get_min_start_hosts(settings):
"""),
    ("horovod/runner/gloo_run.py",
     # The one line replaces a line per failing worker...
     "horovodrun --gloo: no line per failing worker",
     """            if exit_code != 0:
                print('Process {idx} exit with status code {ec}.'.format(idx=index, ec=exit_code))
""",
     """            # horovodrun names the first worker to fail, once (WorkerFailed).
"""),
    ("horovod/runner/gloo_run.py",
     # ... and the line announcing that the others are stopped (they still are).
     "horovodrun --gloo: the others stopped without a line",
     """        if exit_code != 0 and terminate_all_event:
            if not any(ev.is_set() for ev in all_events):
                print('Terminating remaining workers after failure of Process {idx}.'.format(idx=index))
            terminate_all_event.set()
""",
     """        if exit_code != 0 and terminate_all_event:
            terminate_all_event.set()
"""),
    ("horovod/runner/common/util/safe_shell_exec.py",
     # When horovodrun --gloo dies (SIGKILL, SIGHUP, a preemption's SIGUSR1)
     # or stops the others after a failure, each rank's middleman sends it
     # SIGTERM and then SIGKILL 5 s later: too short for a stop that
     # finishes its step and writes a checkpoint of a model of any size.
     # 30 s, as under MPI (hvdtrain.faults.launcher_watch).
     "horovodrun --gloo: 30 s from SIGTERM to SIGKILL, for a stop's checkpoint",
     "GRACEFUL_TERMINATION_TIME_S = 5\n",
     "GRACEFUL_TERMINATION_TIME_S = 30\n"),
    ("horovod/runner/common/util/safe_shell_exec.py",
     # A rank's shell ends with its command's status once the command exits
     # (a worker's 200 after a stop). Horovod froze and killed the shell as
     # soon as the command was gone, racing that exit: the worker's 200
     # became the shell's 137, 30 s later. The shell, no longer running
     # anything, is given the grace to exit; the middleman still reaps it.
     "horovodrun --gloo: a rank's status kept when it stops on SIGTERM",
     """    gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)

""",
     """    gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)
    deadline = time.time() + GRACEFUL_TERMINATION_TIME_S
    while not alive and time.time() < deadline:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)

"""),
    ("horovod/runner/launch.py",
     "horovodrun: exits as its first failing worker did (the import)",
     """from horovod.runner.gloo_run import gloo_run, gloo_run_elastic
""",
     """from horovod.runner.gloo_run import WorkerFailed, gloo_run, gloo_run_elastic
"""),
    ("horovod/runner/launch.py",
     "horovodrun: exits as its first failing worker did",
     """        logging.basicConfig(level=logging.getLevelName(args.log_level))

    _run(args)
""",
     """        logging.basicConfig(level=logging.getLevelName(args.log_level))

    try:
        _run(args)
    except WorkerFailed as failed:
        print(failed, file=sys.stderr)
        sys.exit(failed.exit_code)
"""),
    ("horovod/runner/js_run.py",
     # Python 3.12 removed distutils, and horovodrun imports this module
     # whatever the controller: it then worked only while setuptools' own
     # copy of distutils stood in. shutil.which is the standard library's
     # lookup of a command on PATH (also checking it is executable).
     "horovodrun: no distutils (gone in Python 3.12) to look for jsrun",
     "from distutils.spawn import find_executable\n",
     "from shutil import which as find_executable\n"),
    ("horovod/runner/mpi_run.py",
     "horovodrun --mpi: the first failing worker, in one line and its status (the imports)",
     """import copy
import os
import sys
""",
     """import copy
import os
import re
import signal
import subprocess
import sys
"""),
    ("horovod/runner/mpi_run.py",
     # horovodrun --mpi replaced itself with `sh -c mpirun ...`, so Open MPI
     # told a worker's failure in two blocks of ten framed lines, and a
     # SIGUSR1 meant for the workers (a preemption) killed the shell. Now
     # horovodrun stays mpirun's parent: it passes SIGUSR1/SIGUSR2 on as
     # mpirun does, dies of SIGTERM, SIGINT and SIGHUP as the shell did (its
     # workers see their launcher gone), and turns Open MPI's report of the
     # first failing worker into the one line horovodrun --gloo prints.
     "horovodrun --mpi: the first failing worker, in one line and its status",
     """    else:
        os.execve('/bin/sh', ['/bin/sh', '-c', mpirun_command], env)
""",
     """    else:
        _supervise(mpirun_command, env)


# Open MPI's report of the first worker to fail, in blocks framed by dashes
# on mpirun's stderr (the workers' own lines carry --tag-output's prefix).
_FIRST_FAILURE = [
    (re.compile(r'Process name: \\[\\[\\d+,\\d+\\],(\\d+)\\]\\s+Exit code:\\s+(\\d+)'), 0),
    (re.compile(r'process rank (\\d+) with PID \\d+ on node \\S+ exited on signal (\\d+)'), 128),
]
_ABORTED = 'Primary job  terminated normally, but'


def _supervise(mpirun_command, env):
    from horovod.runner.gloo_run import WorkerFailed

    mpirun = subprocess.Popen(['/bin/sh', '-c', 'exec ' + mpirun_command], env=env,
                              stderr=subprocess.PIPE)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, lambda signum, _: mpirun.send_signal(signum))
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # as the shell: no traceback
    first_failure, block = None, None
    for line in iter(mpirun.stderr.readline, b''):
        if block is None and not line.startswith(b'-----'):
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            continue
        block = (block or []) + [line]
        if len(block) == 1 or not line.startswith(b'-----'):
            continue
        text, block = b''.join(block).decode(errors='replace'), None
        found = [(int(m.group(1)), base + int(m.group(2)))
                 for pattern, base in _FIRST_FAILURE for m in [pattern.search(text)] if m]
        if found:
            first_failure = first_failure or found[0]
        elif _ABORTED not in text:
            sys.stderr.write(text)
            sys.stderr.flush()
    if block:
        sys.stderr.buffer.write(b''.join(block))
    exit_code = mpirun.wait()
    if first_failure and exit_code:
        raise WorkerFailed(*first_failure)
    if exit_code:
        sys.exit(exit_code if exit_code > 0 else 128 - exit_code)
"""),
]


def apply(source_dir):
    """Applies every fix to the sources under `source_dir`; returns the names
    of those applied now (not those found applied already)."""
    applied = []
    for relative, name, released, fixed in FIXES:
        path = pathlib.Path(source_dir) / relative
        text = path.read_text()
        if released in text:
            path.write_text(text.replace(released, fixed))
            applied.append(name)
        elif fixed not in text:
            raise SystemExit(f"Horovod source fix '{name}' no longer matches "
                             f"{relative}: update scripts/horovod_source_fixes.py for this "
                             "Horovod version")
    return applied


if __name__ == "__main__":
    print("; ".join(apply(sys.argv[1])) or "none needed (applied before)")
