"""What can be checked of docker/ without Docker, Kubernetes or Slurm: the
images install with the script CI runs, the manifests parse, their
commands are valid hvdtrain invocations (checked with --dry_run), and the
shells that pass a preemption signal on do so (run around fake launchers)."""

import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml

from launch import REPO, run

DOCKER = REPO / "docker"
RESUMABLE = DOCKER / "resumable.sh"
IMAGE_RESUMABLE = "/hvdtrain/docker/resumable.sh"    # the image's copy of the repository


def _dry_run(command):
    """Runs the `hvdtrain train ...` part of a launch command with --dry_run."""
    start = command.index("hvdtrain")
    result = run([*command[start:], "--dry_run"], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dry run: the flags are valid" in result.stdout
    return result.stdout


def _horovodrun_options(command):
    """horovodrun's own options in `command`, as {option: value}."""
    options, words = {}, iter(command[1:command.index("hvdtrain")])
    for word in words:
        if word in ("--mpi", "--gloo"):
            options[word] = True
        else:
            options[word] = next(words)
    return options


def _commands(script):
    """The commands of a shell script, in order: continued lines joined,
    `a && b` and `a || b` split, `exec` dropped, comments left out."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|\|\|", line):
            words = shlex.split(part, comments=True)
            commands.append(words[1:] if words[:1] == ["exec"] else words)
    return [words for words in commands if words]


def _launch(commands, wrapper=None):
    """The horovodrun command among `commands`, after checking that
    `wrapper` runs it (if given; nothing does otherwise) and that
    `hvdtrain check-config` checked its --config-file first."""
    launches = [i for i, words in enumerate(commands) if "horovodrun" in words[:2]]
    assert len(launches) == 1, commands
    words = commands[launches[0]]
    command = words[words.index("horovodrun"):]
    assert words[:-len(command)] == ([wrapper] if wrapper else []), words
    config = _horovodrun_options(command)["--config-file"]
    assert ["hvdtrain", "check-config", config] in commands[:launches[0]], command
    return command


def _mpijob_launch(job):
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == ["/bin/sh", "-c"]
    return _launch(_commands(launcher["args"][0]), wrapper=IMAGE_RESUMABLE)


def test_every_documented_launch_checks_its_config_file_first():
    # horovodrun ignores a misspelt key and stops with a traceback at a value
    # of the wrong type, so each launch runs `hvdtrain check-config` on the
    # same file first, and stops if it fails.
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    _launch(_commands(demo))            # make stops at the first failing line
    slurm = (DOCKER / "slurm.sbatch").read_text()
    assert "\nset -euo pipefail\n" in slurm
    _launch(_commands(slurm), wrapper="resumable")      # resumable.sh's function, sourced
    _mpijob_launch(yaml.safe_load((DOCKER / "mpijob.yaml").read_text()))   # joined by &&


def test_the_images_install_with_the_script_ci_runs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    runs = " ".join(re.findall(r"^RUN ((?:.*\\\n)*.*)", dockerfile, re.MULTILINE))
    assert "bash scripts/install.sh" in runs and "HVDTRAIN_GPU=${GPU}" in runs
    ci = (REPO / ".ci" / "run").read_text()
    assert re.findall(r"^make test$", ci, re.MULTILINE) == ["make test"]
    assert "make test" in (REPO / "README.md").read_text()
    # install.sh ends with horovodrun --check-build and requires NCCL for GPU builds.
    install = (REPO / "scripts" / "install.sh").read_text()
    assert "check_horovod_build " in install and "needs+=(NCCL)" in install
    assert "horovodrun\" --check-build" in (REPO / "scripts" / "horovod_wheel.sh").read_text()
    # No password, no key in the image: keys are mounted at run time.
    assert "PasswordAuthentication no" in dockerfile and "ssh-keygen" not in dockerfile


def test_the_gpu_image_builds_the_gpu_flavour_as_ci_does():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    build = re.search(r"^#   docker build (?:.*\\\n#)*.*-t hvdtrain:gpu(?:.*\\\n#)*.*$", dockerfile,
                      re.MULTILINE).group(0)
    arguments = dict(re.findall(r"--build-arg (\w+)=(\S+)", build))
    assert arguments["GPU"] == "1"
    # A CUDA 12 devel base (nvcc for the kernels) on Ubuntu 22.04, whose CUDA
    # is no newer than the CUDA 12 runtime tensorflow[and-cuda] brings.
    base = re.fullmatch(r"nvidia/cuda:(12)\.(\d+)\.\d+-devel-ubuntu22\.04", arguments["BASE"])
    assert base, arguments["BASE"]
    pins = (REPO / "constraints.txt").read_text()
    runtime = re.search(r"^nvidia-cuda-runtime-cu12==12\.(\d+)\.", pins, re.MULTILINE)
    assert int(base.group(2)) <= int(runtime.group(1))
    # The image installs with the GPU flag passed through, as `make setup-gpu` does.
    assert re.search(r"^ARG GPU=0$", dockerfile, re.MULTILINE)
    install = re.search(r"^RUN (HVDTRAIN_GPU=\$\{GPU\} .*bash scripts/install\.sh)", dockerfile,
                        re.MULTILINE)
    assert install, dockerfile
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^setup-gpu:\n\tHVDTRAIN_GPU=1 HVDTRAIN_VENV=\S+ bash scripts/install\.sh$",
                     makefile, re.MULTILINE)
    assert "HVDTRAIN_CUDA_HOME=pypi make test-gpu" in (REPO / ".ci" / "run").read_text()


def test_the_mpijob_parses_and_launches_a_valid_command():
    job = yaml.safe_load((DOCKER / "mpijob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    command = _mpijob_launch(job)
    # NCCL's settings on the launcher, whose environment horovodrun forwards.
    assert {e["name"]: e["value"] for e in launcher["env"]}["NCCL_SOCKET_IFNAME"] == "eth0"
    options = _horovodrun_options(command)
    assert command[0] == "horovodrun"
    assert options["--config-file"] == "/hvdtrain/horovodrun.cfg"   # the image's copy
    workers = specs["Worker"]["replicas"] * job["spec"]["slotsPerWorker"]
    assert int(options["-np"]) == workers
    gpus = specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpus["nvidia.com/gpu"] == job["spec"]["slotsPerWorker"]
    assert "--resume" in _dry_run(command)


def test_the_slurm_script_is_valid_bash_and_launches_a_valid_command():
    script = DOCKER / "slurm.sbatch"
    assert run(["bash", "-n", script], timeout=30).returncode == 0
    text = script.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.MULTILINE))
    assert directives["ntasks-per-node"] == directives["gpus-per-node"]   # a process per GPU
    exports = dict(re.findall(r"^export (NCCL_\w+)=(\S+)", text, re.MULTILINE))
    assert exports["NCCL_SOCKET_IFNAME"] == "${NCCL_SOCKET_IFNAME:-^lo,docker}"
    assert text.index("export NCCL_SOCKET_IFNAME") < text.index("\nresumable horovodrun ")
    command = _launch(_commands(text), wrapper="resumable")
    options = _horovodrun_options(command)
    assert options["--config-file"] == "horovodrun.cfg" and options["-np"] == "$SLURM_NTASKS"
    _dry_run([word.replace("$SLURM_JOB_ID", "1") for word in command])


def test_the_docs_launches_check_their_config_file_first():
    docs = "".join(path.read_text() for path in [REPO / "README.md",
                                                  *sorted((REPO / "docs").glob("*.md"))])
    launches = 0
    for block in re.findall(r"^```sh\n(.*?)^```", docs, re.MULTILINE | re.DOTALL):
        commands = _commands(block)
        for i, words in enumerate(commands):
            if "horovodrun" in words[:2] and "--config-file" in words:   # maybe after resumable.sh
                launches += 1
                config = words[words.index("--config-file") + 1]
                assert ["hvdtrain", "check-config", config] in commands[:i], words
    assert launches >= 3


# Preemption: the shells between a cluster's signal and the ranks, run
# around fakes. A fake rank or launcher records the signals it gets and,
# after the first, exits 200 a second later, as preempted ranks do once
# their checkpoint is written (a second signal meanwhile finds it running).
_FAKE_RANK = '''#!{python}
import os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
got = []
def record(number, frame):
    got.append(number)
    log.write(signal.Signals(number).name + "\\n")
for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(number, record)
log.write(f"ready {{os.getpid()}}\\n")
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(1)
sys.exit(200 if got else 1)
'''


# The daemon that starts the ranks on a host (Open MPI's orted), fake.
_FAKE_ORTED = '''#!{python}
import os, subprocess, sys
rank = os.path.join(os.path.dirname(sys.argv[0]), "rank")
sys.exit(subprocess.call([rank, *sys.argv[1:]]))
'''
# horovodrun --mpi as it runs mpirun: from a shell that does not exec it.
_MPI_SHELL = ["sh", "-c", 'mpirun "$1"; exit $?', "sh"]


def _fake_commands(directory, **scripts):
    """Executable files in `directory`, by name: scripts' texts ({python}
    for this Python); "rank" and its links "mpirun" and "horovodrun", named
    as the launchers they stand for (a process is named after its script)."""
    directory.mkdir()
    for name, text in {"rank": _FAKE_RANK, **scripts}.items():
        (directory / name).write_text(text.format(python=sys.executable))
        (directory / name).chmod(0o755)
    for name in ("mpirun", "horovodrun"):
        if not (directory / name).exists():
            (directory / name).symlink_to(directory / "rank")
    return dict(os.environ, PATH=f"{directory}{os.pathsep}{os.environ['PATH']}")


def _wait_for(condition, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _records(log):
    """The signals a fake rank recorded, after its line "ready PID"."""
    _wait_for(log.exists, "fake rank")
    ready, *signals = log.read_text().splitlines()
    assert ready.startswith("ready "), ready
    return signals


def _signal_when_ready(process, log, number, again=True):
    """Signals `process` once the fake rank logging to `log` runs, and
    (`again`) once more after the rank got the first signal passed on."""
    _wait_for(lambda: log.exists() and "ready" in log.read_text(), "fake rank")
    process.send_signal(number)
    if again:
        _wait_for(lambda: _records(log), "signal passed on to the fake rank")
        process.send_signal(number)


def test_resumable_sh_is_valid_bash_and_executable():
    assert run(["bash", "-n", RESUMABLE], timeout=30).returncode == 0
    assert os.access(RESUMABLE, os.X_OK)


@pytest.mark.parametrize("launch, passed_on", [
    # horovodrun --gloo passes SIGTERM to its workers.
    (["horovodrun"], "SIGTERM"),
    # horovodrun --mpi runs mpirun as its child (Horovod's own becomes
    # `sh -c "mpirun ..."`, which may exec it); mpirun passes SIGUSR1 to every rank.
    (["mpirun"], "SIGUSR1"),
    (_MPI_SHELL, "SIGUSR1"),
], ids=["gloo", "mpirun", "mpirun-under-sh"])
def test_resumable_sh_passes_a_stop_on_once_and_exits_with_the_launchers_status(
        tmp_path, launch, passed_on):
    env = _fake_commands(tmp_path / "bin")
    log = tmp_path / "signals"
    with subprocess.Popen([RESUMABLE, *launch, log], env=env, stderr=subprocess.PIPE,
                          text=True) as wrapper:
        _signal_when_ready(wrapper, log, signal.SIGTERM)
        _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 200, stderr
    assert _records(log) == [passed_on]
    target = "mpirun" if passed_on == "SIGUSR1" else "horovodrun"
    assert re.search(rf"^resumable.sh: SIGTERM: passed on as {passed_on} to {target} \(pid \d+\)$",
                     stderr, re.MULTILINE), stderr
    assert "resumable.sh: SIGTERM again: not passed on" in stderr


def test_a_terminals_ctrl_c_reaches_mpirun_as_sigusr1_only(tmp_path):
    # A terminal sends SIGINT to its foreground process group: mpirun, in a
    # group of its own, gets it from resumable.sh only, as SIGUSR1.
    env = _fake_commands(tmp_path / "bin")
    log = tmp_path / "signals"
    # With SIGINT at its default action, as a terminal's shell starts it: a
    # suite started in the background inherits SIGINT ignored, and a shell
    # cannot trap a signal it was started with ignored.
    with subprocess.Popen([RESUMABLE, *_MPI_SHELL, log], env=env, stderr=subprocess.PIPE,
                          text=True, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
                          ) as wrapper:
        _wait_for(lambda: log.exists() and "ready" in log.read_text(), "fake rank")
        os.killpg(wrapper.pid, signal.SIGINT)
        _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 200, stderr
    assert _records(log) == ["SIGUSR1"]


_FAKE_SLURM = dict(
    hvdtrain="#!/bin/sh\nexit 0\n",
    scontrol='#!/bin/sh\ncase $1 in\n  show) echo node1; echo node2 ;;\n'
             '  requeue) echo "requeue $2" >>"$REQUEUES" ;;\nesac\n',
    # horovodrun --mpi: replaced by a shell that runs mpirun, unless told
    # to exit with a status.
    horovodrun='#!/bin/sh\n[ -n "$LAUNCH_STATUS" ] && exit "$LAUNCH_STATUS"\n'
               f'exec {shlex.join(_MPI_SHELL)} "$SIGNALS"\n',
)


def _start_sbatch(tmp_path, launch_status=""):
    """Starts docker/slurm.sbatch as Slurm would, with fake Slurm, hvdtrain
    and launcher commands; returns the process."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("")
    env = _fake_commands(tmp_path / "bin", **_FAKE_SLURM)
    env.update(HVDTRAIN_VENV=str(tmp_path / "venv"), LAUNCH_STATUS=launch_status,
               SIGNALS=str(tmp_path / "signals"), REQUEUES=str(tmp_path / "requeues"),
               SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node[1-2]", SLURM_NTASKS_PER_NODE="8",
               SLURM_NTASKS="16")
    return subprocess.Popen(["bash", DOCKER / "slurm.sbatch"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _requeues(tmp_path):
    path = tmp_path / "requeues"
    return path.read_text().splitlines() if path.exists() else []


def test_the_slurm_script_asks_for_a_signal_before_the_time_limit():
    text = (DOCKER / "slurm.sbatch").read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.MULTILINE))
    # To the batch shell (B:), which passes it on; Slurm's resolution is a minute.
    warning = re.fullmatch(r"B:USR1@(\d+)", directives["signal"])
    assert warning and int(warning.group(1)) >= 60, directives["signal"]
    assert directives["open-mode"] == "append"    # a requeued start's output after the last


@pytest.mark.parametrize("launch_status, exit_status, requeues", [
    ("200", 0, ["requeue 42"]),     # preempted: back in the queue
    ("0", 0, []),                   # done
    ("1", 1, []),                   # a failure, and a usage error: would fail again
    ("2", 2, []),
])
def test_the_slurm_script_requeues_itself_only_when_preempted(tmp_path, launch_status,
                                                              exit_status, requeues):
    with _start_sbatch(tmp_path, launch_status) as job:
        output, _ = job.communicate(timeout=60)
    assert job.returncode == exit_status, output
    assert _requeues(tmp_path) == requeues


def test_the_slurm_scripts_signal_reaches_the_ranks_through_mpirun_and_requeues(tmp_path):
    # Slurm's B:USR1 reaches the batch shell only.
    with _start_sbatch(tmp_path) as job:
        _signal_when_ready(job, tmp_path / "signals", signal.SIGUSR1)
        output, _ = job.communicate(timeout=60)
    assert job.returncode == 0, output
    assert _records(tmp_path / "signals") == ["SIGUSR1"]
    assert _requeues(tmp_path) == ["requeue 42"]
    assert "resumable.sh: SIGUSR1: passed on as SIGUSR1 to mpirun" in output


def _mpijob_spec(role):
    job = yaml.safe_load((DOCKER / "mpijob.yaml").read_text())
    return job, job["spec"]["mpiReplicaSpecs"][role]


def test_the_mpijob_restarts_its_launcher_and_gives_time_to_checkpoint():
    job, launcher = _mpijob_spec("Launcher")
    # No restart policy by exit status in v2beta1: OnFailure, within backoffLimit.
    assert launcher["restartPolicy"] == "OnFailure" and job["spec"]["runPolicy"]["backoffLimit"] > 3
    for role in ("Launcher", "Worker"):
        grace = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        assert grace["terminationGracePeriodSeconds"] >= 60, role     # a step and a save
    # The image holds the repository at /hvdtrain, resumable.sh with it.
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "\nWORKDIR /hvdtrain\nCOPY . .\n" in dockerfile
    assert REPO / pathlib.PurePath(IMAGE_RESUMABLE).relative_to("/hvdtrain") == RESUMABLE


def test_an_mpijob_workers_pid_1_passes_sigterm_to_its_ranks_and_keeps_serving_ssh(tmp_path):
    _, worker = _mpijob_spec("Worker")
    container = worker["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/sh", "-c"]
    script = container["args"][0]
    # sshd, until the test stops it; orted under a name of the test's own,
    # so that no other orted's ranks on this machine are signalled.
    stop = tmp_path / "stop-sshd"
    sshd = f"sh -c 'until [ -e {stop} ]; do sleep 0.1; done' &"
    assert script.count("/usr/sbin/sshd -De &") == 1 and script.count("= orted ]") == 1
    script = script.replace("/usr/sbin/sshd -De &", sshd).replace("= orted ]", "= test-orted ]")
    env = _fake_commands(tmp_path / "bin", **{"test-orted": _FAKE_ORTED})
    log = tmp_path / "signals"
    with subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as pid_1, \
            subprocess.Popen([tmp_path / "bin" / "test-orted", log], env=env) as daemon:
        _signal_when_ready(pid_1, log, signal.SIGTERM, again=False)    # Kubernetes sends one
        assert daemon.wait(timeout=30) == 200           # the rank stopped, preempted
        assert pid_1.poll() is None                     # while sshd went on serving
        stop.touch()
        output, _ = pid_1.communicate(timeout=30)
    assert _records(log) == ["SIGTERM"]
    rank = log.read_text().split()[1]
    assert f"worker: SIGTERM passed on to the ranks: {rank}" in output
