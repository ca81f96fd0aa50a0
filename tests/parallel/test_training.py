"""Data-parallel training at np=2: the shards each rank reads, checked on
what the ranks wrote.

Own launches: each checks the intra-op thread pool that hvdtrain.init sizes
at process start (automatic, or the user's choice)."""

import json
import os

from launch import horovodrun, worker
from run_checks import ok


def _read_shards(tmp_path, examples, batch_size, intra_op_threads=0):
    ok(horovodrun([*worker("shards"), tmp_path, examples, batch_size, intra_op_threads]))
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_shards_are_disjoint_and_cover_the_training_set(tmp_path):
    rank0, rank1 = _read_shards(tmp_path, examples=1000, batch_size=16)
    assert not set(rank0["read"]) & set(rank1["read"])
    read = set(rank0["read"]) | set(rank1["read"])
    assert len(rank0["read"]) == len(rank1["read"]) == 31 * 16
    # The documented remainder: what no rank reads, here 2 x (500 - 31 x 16).
    assert rank0["dropped"] == rank1["dropped"] == 1000 - len(read) == 8
    assert read <= set(range(1000))
    # Two processes on this host share its cores.
    cores = len(os.sched_getaffinity(0))
    assert rank0["intra_op_threads"] == rank1["intra_op_threads"] == max(1, cores // 2)


def test_uneven_data_gives_every_rank_the_same_steps(tmp_path):
    # 1,001 examples: shards of 501 and 500, i.e. 3 and 2 batches of 167.
    rank0, rank1 = _read_shards(tmp_path, examples=1001, batch_size=167, intra_op_threads=3)
    assert rank0["steps"] == rank1["steps"] == 2
    assert rank0["fit_steps"] == rank1["fit_steps"] == 2 * 2  # two epochs
    assert len(rank0["read"]) == len(rank1["read"]) == 2 * 167
    assert rank0["dropped"] == 1001 - 2 * 2 * 167
    assert rank0["intra_op_threads"] == rank1["intra_op_threads"] == 3  # the user's choice
