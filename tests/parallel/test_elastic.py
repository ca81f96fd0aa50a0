"""Elastic training under horovodrun's elastic mode (Gloo only): real workers
killed with SIGKILL and hosts added to the discovery script's list, checked
on what rank 0 logged and the ranks wrote.

Horovod treats a host name as this machine when it resolves to one of its
addresses, and blacklists a host name when a worker on it fails (for the
rest of the run, unless --blacklist-cooldown-range lets it back). So each
worker gets a host name of its own, all local: localhost, 127.0.0.1 and, as
a third, this machine's name or address.
Own launches: horovodrun's elastic mode, its host discovery and workers killed under it."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from horovod.runner.util import network

from hvdtrain.state import checkpoint
from launch import rank_lines, rank_pid, start, worker


@contextlib.contextmanager
def elastic_run(tmp_path, hosts, workers, *worker_args, command=None):
    """Starts horovodrun with `workers` processes (1 to 2 later) on the hosts
    that the discovery script reads from tmp_path/hosts (and copies to
    tmp_path/discovered), each running `command` (default: the elastic_train
    worker with `worker_args`); yields the process and the workers' output
    folder, tmp_path/out."""
    (tmp_path / "hosts").write_text("".join(f"{host}:1\n" for host in hosts))
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncp '{tmp_path}/hosts' '{tmp_path}/read' && "
                        f"mv '{tmp_path}/read' '{tmp_path}/discovered' && "
                        f"cat '{tmp_path}/discovered'\n")
    discover.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    # All workers are local: Gloo talks over loopback, and with the interface
    # given Horovod does not need two hosts to start.
    command = ["horovodrun", "-np", workers, "--min-np", 1, "--max-np", 2,
               "--host-discovery-script", discover, "--gloo", "--network-interface", "lo",
               *(command or [*worker("elastic_train"), out, *worker_args])]
    process = start(command, tmp_path / "horovodrun.log")
    try:
        yield process, out
    finally:
        if process.poll() is None:
            process.terminate()  # horovodrun stops its workers on SIGTERM
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for(condition, process, tmp_path, what, timeout=60):
    """Waits for `condition()`, failing if horovodrun ends or hangs first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"horovodrun exited ({process.returncode}) " \
                                       f"before {what}:\n{output(tmp_path)}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{output(tmp_path)}"
        time.sleep(0.05)


def wait_until_held(process, out, tmp_path, ranks):
    """Waits until worker ranks 0 .. ranks - 1 hold at epoch 1, batch 5 (--hold)."""
    wait_for(lambda: all((out / f"held.rank{r}").exists() for r in range(ranks)), process,
             tmp_path, "hold at epoch 1, batch 5")


def finish(process, tmp_path):
    try:
        returncode = process.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"horovodrun still running after 60 s:\n{output(tmp_path)}")
    assert returncode == 0, output(tmp_path)


def output(tmp_path):
    return (tmp_path / "horovodrun.log").read_text()[-4000:]


def read_log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def position(line):
    return line["epoch"], line["batch"], line["seen"]


def replay(log):
    """Replays rank 0's log and checks it: each batch follows the last one
    kept, each commit is where training stood, each (re)start resumes from
    the last commit. Returns the batches whose updates the final state holds,
    and for each start, its line and the batches it rolled back."""
    steps, per_rank_batch = log[0]["steps_per_epoch"], log[0]["per_rank_batch"]
    kept, committed, starts = [], 0, []

    def stood_after(count):
        if not count:
            return 0, 0, 0
        epoch, batch, seen = position(kept[count - 1])
        return (epoch + 1, 0, seen) if batch == steps else (epoch, batch, seen)

    for line in log:
        if line["event"] == "start":
            assert position(line) == stood_after(committed), (line, kept[committed:])
            starts.append((line, kept[committed:]))
            del kept[committed:]
        elif line["event"] == "batch":
            epoch, batch, seen = stood_after(len(kept))
            assert position(line) == (epoch, batch + 1, seen + per_rank_batch * line["size"]), line
            kept.append(line)
        elif line["event"] == "commit":
            assert position(line) == stood_after(len(kept)), line
            committed = len(kept)
    return kept, starts


def check_training(log, kept, weights):
    """The run trained every batch of every epoch once, at a learning rate
    scaled by the world size, and learnt the task."""
    settings = log[0]
    assert len(kept) == settings["epochs"] * settings["steps_per_epoch"]
    for line in log:
        assert line["lr"] == pytest.approx(settings["base_lr"] * line["size"]), line
    end = log[-1]
    assert end["event"] == "end" and end["epoch"] == settings["epochs"]
    assert end["accuracy"] >= 0.9 and end["loss"] < 0.4 * kept[0]["loss"], end
    # The optimizer counted the kept updates only: rolled-back ones were undone.
    [iterations] = [weights[name] for name in weights.files if name.endswith("/iteration")]
    assert iterations == len(kept)
    for name in weights.files:
        assert np.isfinite(weights[name]).all(), name


def third_local_host_name():
    local = network.get_local_host_addresses()
    for name in [socket.gethostname(), *sorted(local)]:
        if name not in ("localhost", "127.0.0.1") and network.resolve_host_address(name) in local:
            return name
    pytest.skip("this machine has no host name besides localhost and 127.0.0.1 that resolves "
                "to one of its own addresses, and the test needs a third local host")


@pytest.mark.timeout(150)
def test_killed_worker_leaves_the_survivor_to_finish_from_the_last_commit(tmp_path):
    with elastic_run(tmp_path, ["localhost", "127.0.0.1"], 2, "--hold", 1, 5, 2) as (process, out):
        wait_until_held(process, out, tmp_path, ranks=2)
        killed = int((out / "held.rank1").read_text())
        os.kill(killed, signal.SIGKILL)
        (out / "go").touch()
        finish(process, tmp_path)

    log = read_log(out)
    kept, [(first, _), (resumed, rolled_back)] = replay(log)
    assert first["size"] == 2 and resumed["size"] == 1
    assert resumed["pids"] == [first["pids"][0]] and killed == first["pids"][1]
    # Commits every 3 batches (the last at epoch 1, batch 4): only the batch
    # after it, taken by both workers, was done again by the survivor.
    assert [position(line)[:2] + (line["size"],) for line in rolled_back] == [(1, 5, 2)]
    assert [line["size"] for line in kept] == [2] * 12 + [1] * 20
    assert sorted(p.name for p in out.glob("weights.*")) == ["weights.rank0.npz"]
    check_training(log, kept, np.load(out / "weights.rank0.npz"))


@pytest.mark.timeout(150)
def test_added_host_joins_with_the_current_state(tmp_path):
    with elastic_run(tmp_path, ["localhost"], 1, "--hold", 1, 5, 1,
                     "--wait-for-hosts") as (process, out):
        wait_until_held(process, out, tmp_path, ranks=1)
        with open(tmp_path / "hosts", "a") as hosts:
            hosts.write("127.0.0.1:1\n")
        (out / "go").touch()
        finish(process, tmp_path)

    log = read_log(out)
    kept, [(first, _), (joined, rolled_back)] = replay(log)
    assert first["hosts"] == ["localhost"] and joined["hosts"] == ["localhost", "127.0.0.1"]
    assert joined["pids"][0] == first["pids"][0]
    # A host change is taken at a commit: nothing is done twice.
    seen = (first["steps_per_epoch"] + 5) * first["per_rank_batch"]
    assert rolled_back == [] and position(joined) == (1, 5, seen)
    assert [line["size"] for line in kept] == [1] * 13 + [2] * 19
    rank0, rank1 = np.load(out / "weights.rank0.npz"), np.load(out / "weights.rank1.npz")
    assert rank0.files == rank1.files
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    check_training(log, kept, rank0)


@pytest.mark.timeout(150)
def test_failed_host_is_blacklisted_and_a_new_one_replaces_it(tmp_path):
    third = third_local_host_name()
    with elastic_run(tmp_path, ["localhost", "127.0.0.1"], 2, "--hold", 1, 5, 2) as (process, out):
        wait_until_held(process, out, tmp_path, ranks=2)
        with open(tmp_path / "hosts", "a") as hosts:
            hosts.write(f"{third}:1\n")
        # Kill once the driver knows the new host, so that it restarts with it.
        wait_for(lambda: third in (tmp_path / "discovered").read_text(), process, tmp_path,
                 f"discovery of {third}")
        killed = int((out / "held.rank1").read_text())
        os.kill(killed, signal.SIGKILL)
        (out / "go").touch()
        finish(process, tmp_path)

    log = read_log(out)
    kept, [(first, _), (replaced, rolled_back)] = replay(log)
    survivor, failed = first["hosts"]
    # The failed host is still listed, but no worker runs there again.
    assert failed != third and replaced["hosts"] == [survivor, third]
    assert replaced["pids"][0] == first["pids"][0] and killed not in replaced["pids"]
    assert [position(line)[:2] for line in rolled_back] == [(1, 5)]
    assert [line["size"] for line in kept] == [2] * 32
    rank0, rank1 = np.load(out / "weights.rank0.npz"), np.load(out / "weights.rank1.npz")
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
    check_training(log, kept, rank0)


# Under elastic mode a signal that would preempt a static run is a lost
# worker: the others go on, as after a crash.
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_cli_trains_on_after_a_worker_is_killed(tmp_path, sig):
    out = tmp_path / "out"
    train = ["hvdtrain", "train", f"--model_dir={out}", "--epochs=3", "--batch_size=8",
             "--checkpoint_steps=20", "--elastic_commit_steps=10"]
    with elastic_run(tmp_path, ["localhost", "127.0.0.1"], 2, command=train) as (process, _):
        # 89 steps an epoch on 2 workers: global step 100 is step 11 of the second epoch.
        wait_for((out / "checkpoints" / "epoch-0002-step-000011").exists, process, tmp_path,
                 "a checkpoint in the second epoch")
        os.kill(rank_pid(1, str(out)), sig)
        finish(process, tmp_path)

    logged = "\n".join(text for rank, text in rank_lines((tmp_path / "horovodrun.log").read_text())
                       if rank == 0)
    restart = re.search(r"elastic restart, world size 2 -> 1: from the commit after epoch "
                        r"(\d), step (\d+) of 89, going on after epoch (\d), step (\d+) of 179",
                        logged)
    assert restart, logged[-4000:]
    epoch, step, going_on_epoch, going_on_step = map(int, restart.groups())
    # From a commit inside an epoch, at the same example: twice the steps on half the workers.
    assert epoch >= 2 and 0 < step < 89 and (going_on_epoch, going_on_step) == (epoch, 2 * step)
    done = re.search(r"digits_cnn on 1 worker, \d epochs? in \S+ s: .*val_accuracy (\d\.\d+)",
                     logged)
    # The kill lands at a different step each run, and the last epoch's small batches on one
    # worker are noisy (0.89-0.96 seen): the bar says the model went on learning, far above 0.1.
    assert done and float(done.group(1)) > 0.8, logged[-4000:]
    assert (out / "model.keras").exists() and (out / "saved_model").is_dir()
    # Rank 0's checkpoints went on too: the last one after the last epoch, on one worker.
    last, _ = checkpoint.read(checkpoint.listed(out / "checkpoints")[0])
    assert (last.position.epoch, last.position.step, last.position.workers) == (3, 0, 1)
