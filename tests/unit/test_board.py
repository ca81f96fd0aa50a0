"""The board every rank of a job writes on (hvdtrain.faults.board), at one
process: a run's store, and the next run's in its place."""

import horovod.tensorflow as hvd

from hvdtrain.faults.board import open_for_run


def test_rank_0_serves_a_store_for_each_run_and_the_next_run_takes_its_place():
    hvd.init()
    first, run = open_for_run(None)
    assert first.served and len(run) == 12   # rank 0's id for the run
    first.put("scope", 1, {"phase": "loading data"})
    assert first.read("scope", range(3)) == {1: {"phase": "loading data"}}
    # A process may train again (a notebook, a sweep): each run its own store and id.
    second, other = open_for_run(None)
    assert other != run and second.read("scope", range(3)) == {}
    assert first.read("scope", range(3)) == {}   # the first run's store is gone


def test_a_launchers_store_is_used_as_it_is_each_run_numbered_by_the_rank():
    hvd.init()
    launchers, _ = open_for_run(None)   # as horovodrun's Gloo rendezvous server would be
    board, run = open_for_run(launchers)
    again, next_run = open_for_run(launchers)
    assert board is again is launchers and run != next_run
