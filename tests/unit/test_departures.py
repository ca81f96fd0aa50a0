"""What a rank says when another left the run (hvdtrain.faults.departures):
the rank that failed and its own words, never one that finished."""

import horovod.tensorflow as hvd
import pytest

from hvdtrain.faults import departures
from hvdtrain.faults.board import open_for_run


@pytest.fixture
def run(monkeypatch):
    """Rank 0's view of a run of 4 ranks whose board this process serves."""
    hvd.init()
    board, run = open_for_run(None)
    board.served = False   # not rank 0's own failure: no wait for the others
    monkeypatch.setattr(departures, "_run", departures._Run(board, run, 0, 4))
    yield departures._run
    monkeypatch.setattr(departures, "_run", None)


def _says(run, rank, line, time):
    run.board.put(run.scope, rank, dict(line=line, time=time))


def test_the_first_rank_to_fail_is_named_with_its_line(run):
    _says(run, 3, "bad input on rank 3", time=20)
    _says(run, 2, "the loss is nan at epoch 2, step 6 on rank 2; lower --learning_rate", time=10)
    run.board.put(run.scope, 1, dict(heard=True))   # a rank that stopped with it
    assert departures.why_stopped("Horovod has been shut down") == (
        "stopped because rank 2 failed (rank 3 too): the loss is nan at epoch 2, step 6 on "
        "rank 2; lower --learning_rate")
    # ... and the failing rank learns it was heard.
    assert run.board.read(run.scope, [0]) == {0: {"heard": True}}


def test_a_rank_gone_without_a_word_is_not_said_to_have_failed(run):
    message = departures.why_stopped("Connection closed by peer")
    assert message.startswith("stopped because another worker ended or stopped responding "
                              "without a word (Connection closed by peer)")
    assert "failed" not in message


def test_a_failure_is_on_the_board_of_its_own_run_only(run):
    departures.fail("corrupt image x.png; replace or remove it")
    assert run.board.read(run.scope, [0])[0]["line"] == "corrupt image x.png; replace or remove it"
    board, other = open_for_run(None)
    assert board.read(f"hvdtrain.departures.{other}", [0]) == {}
