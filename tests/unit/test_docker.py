"""What can be checked of docker/ without Docker, Kubernetes or Slurm: the
images install with the script CI runs, the manifests parse, and their
commands are valid hvdtrain invocations (checked with --dry_run)."""

import re
import shlex

import yaml

from launch import REPO, run

DOCKER = REPO / "docker"


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
    `a && b` split, `exec` dropped, comments left out."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            commands.append(words[1:] if words[:1] == ["exec"] else words)
    return [words for words in commands if words]


def _launch(commands):
    """The horovodrun command among `commands`, after checking that
    `hvdtrain check-config` checked its --config-file first."""
    launches = [i for i, words in enumerate(commands) if words[0] == "horovodrun"]
    assert len(launches) == 1, commands
    command = commands[launches[0]]
    config = _horovodrun_options(command)["--config-file"]
    assert ["hvdtrain", "check-config", config] in commands[:launches[0]], command
    return command


def _mpijob_launch(job):
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == ["/bin/sh", "-c"]
    return _launch(_commands(launcher["args"][0]))


def test_every_documented_launch_checks_its_config_file_first():
    # horovodrun ignores a misspelt key and stops with a traceback at a value
    # of the wrong type, so each launch runs `hvdtrain check-config` on the
    # same file first, and stops if it fails.
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    _launch(_commands(demo))            # make stops at the first failing line
    slurm = (DOCKER / "slurm.sbatch").read_text()
    assert "\nset -euo pipefail\n" in slurm
    _launch(_commands(slurm))
    _mpijob_launch(yaml.safe_load((DOCKER / "mpijob.yaml").read_text()))   # joined by &&


def test_the_images_install_with_the_script_ci_runs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    runs = " ".join(re.findall(r"^RUN ((?:.*\\\n)*.*)", dockerfile, re.MULTILINE))
    assert "bash scripts/install.sh" in runs and "HVDTRAIN_GPU=${GPU}" in runs
    assert re.findall(r"^make test$", (REPO / ".ci" / "run").read_text(), re.MULTILINE) == ["make test"]
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
    assert text.index("export NCCL_SOCKET_IFNAME") < text.index("\nhorovodrun ")
    command = _launch(_commands(text))
    options = _horovodrun_options(command)
    assert options["--config-file"] == "horovodrun.cfg" and options["-np"] == "$SLURM_NTASKS"
    _dry_run([word.replace("$SLURM_JOB_ID", "1") for word in command])


def test_the_readmes_launches_check_their_config_file_first():
    readme = (REPO / "README.md").read_text()
    launches = 0
    for block in re.findall(r"^```sh\n(.*?)^```", readme, re.MULTILINE | re.DOTALL):
        commands = _commands(block)
        for i, words in enumerate(commands):
            if words[0] == "horovodrun" and "--config-file" in words:
                launches += 1
                config = words[words.index("--config-file") + 1]
                assert ["hvdtrain", "check-config", config] in commands[:i], words
    assert launches >= 3
