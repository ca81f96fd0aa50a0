"""Which rank the watchdog names, from the ranks' heartbeats."""

from hvdtrain.faults.watchdog import stall_message


def _beat(phase, waiting, batches=None, age=1):
    return dict(host="h", pid=100, phase=phase, idle=12, waiting=waiting, batches=batches,
                time=1000 - age)


def test_the_rank_outside_a_collective_is_named_and_the_waiting_ones_said_to_wait():
    beats = {0: _beat("loading data", True), 1: _beat("loading data", False),
             2: _beat("loading data", True)}
    assert stall_message(beats, 3, 12, 1000) == (
        "hvdtrain: error: no progress for 12 s: rank 1 stopped making progress (rank 1 on h, "
        "pid 100: loading data, idle 12 s); ranks 0, 2 wait for it in a collective; stopping "
        "the job (if a step can take that long, raise --stall_timeout)")


def test_inside_a_training_step_the_rank_whose_input_delivered_fewer_batches_is_named():
    beats = {0: _beat("training epoch 2, step 6", False, batches=38),
             1: _beat("training epoch 2, step 6", False, batches=37)}
    assert "rank 1 stopped making progress (rank 1 on h" in stall_message(beats, 2, 12, 1000)


def test_a_rank_without_a_recent_heartbeat_is_named_as_gone():
    beats = {0: _beat("training epoch 1, step 3", True), 1: _beat("loading data", False, age=60)}
    message = stall_message(beats, 3, 12, 1000)
    assert "ranks 1, 2 stopped making progress (rank 1 on h, pid 100: loading data, heartbeat " \
           "lost; rank 2: no heartbeat, its process or host is gone); rank 0 waits for them" \
           in message


def test_ranks_all_in_one_place_are_all_named():
    beats = {r: _beat("training epoch 1, step 3", True) for r in range(2)}
    assert "ranks 0, 1 stopped making progress" in stall_message(beats, 2, 12, 1000)


def test_a_rank_that_finished_is_not_named():
    beats = {0: _beat("exporting the model", False),
             1: dict(_beat("finished", False, age=60), done=True)}
    message = stall_message(beats, 2, 12, 1000)
    assert "rank 0 stopped making progress" in message and "wait" not in message

