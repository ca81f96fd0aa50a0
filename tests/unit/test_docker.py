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


def test_the_images_install_with_the_script_ci_runs():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    runs = " ".join(re.findall(r"^RUN ((?:.*\\\n)*.*)", dockerfile, re.MULTILINE))
    assert "bash scripts/install.sh" in runs and "HVDTRAIN_GPU=${GPU}" in runs
    assert (REPO / ".ci" / "run").read_text().count("make test") == 1
    assert "make test" in (REPO / "README.md").read_text()
    # install.sh ends with horovodrun --check-build and requires NCCL for GPU builds.
    install = (REPO / "scripts" / "install.sh").read_text()
    assert "check_horovod_build " in install and "needs+=(NCCL)" in install
    assert "horovodrun\" --check-build" in (REPO / "scripts" / "horovod_wheel.sh").read_text()
    # No password, no key in the image: keys are mounted at run time.
    assert "PasswordAuthentication no" in dockerfile and "ssh-keygen" not in dockerfile


def test_the_mpijob_parses_and_launches_a_valid_command():
    job = yaml.safe_load((DOCKER / "mpijob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    specs = job["spec"]["mpiReplicaSpecs"]
    command = specs["Launcher"]["template"]["spec"]["containers"][0]["command"]
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
    launch = re.search(r"^horovodrun (?:.*\\\n)*.*", text, re.MULTILINE).group(0)
    command = shlex.split(launch.replace("\\\n", " "))
    options = _horovodrun_options(command)
    assert options["--config-file"] == "horovodrun.cfg" and options["-np"] == "$SLURM_NTASKS"
    _dry_run([word.replace("$SLURM_JOB_ID", "1") for word in command])
