"""A launch across two hosts (network namespaces with their own sshd, see
tests/hosts.py): horovodrun on hostA starts a rank there and one on hostB
through ssh, and the two train one model together over the hosts' link.
Own launches: a launch across hosts."""

import json

import pytest

import hosts
from launch import rank_lines, run, worker


@pytest.fixture(scope="module")
def two_hosts():
    try:
        with hosts.two_hosts() as pair:
            yield pair
    except hosts.Unavailable as reason:
        pytest.skip(str(reason))


def test_ranks_on_two_hosts_train_one_model(two_hosts, controller, tmp_path):
    a, b = two_hosts.hosts
    result = run(a.command(["horovodrun", "-np", 2, "-H", f"{a.name}:1,{b.name}:1",
                            f"--{controller}", "--network-interface", hosts.INTERFACE,
                            # No ssh check results cached in ~/.horovod.
                            "--disable-cache",
                            *worker("multi_host_train"), tmp_path / "data", hosts.INTERFACE]),
                 env=two_hosts.env, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = {rank: json.loads(text.removeprefix("multi_host "))
             for rank, text in rank_lines(result.stdout) if text.startswith("multi_host ")}
    assert sorted(ranks) == [0, 1], result.stdout[-3000:]
    rank0, rank1 = ranks[0], ranks[1]
    # One rank on each host, each alone there, talking over the hosts' link.
    assert {(r["hostname"], r["address"]) for r in ranks.values()} == {
        (a.name, a.address), (b.name, b.address)}
    assert [(r["cross_rank"], r["cross_size"], r["local_rank"]) for r in (rank0, rank1)] == [
        (0, 2, 0), (1, 2, 0)]
    # They started from rank 0's weights and their own batches gave them
    # different losses, so different gradients; ending with the same weights,
    # they applied the average of both.
    assert rank0["initial"] == rank1["initial"]
    assert rank0["loss"] != rank1["loss"]
    assert rank0["final"] == rank1["final"] != rank0["initial"]
