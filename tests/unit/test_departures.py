"""What a rank says when another left the run (hvdtrain.faults.departures):
the rank that failed and its own words, never one that finished."""

import horovod.tensorflow as hvd
import pytest

from hvdtrain.faults import departures
from hvdtrain.faults.board import open_for_run


@pytest.fixture
def run(monkeypatch):
    """Rank 0's view of a run whose board this process serves."""
    hvd.init()
    board, run = open_for_run(None)
    board.served = False   # as a launcher's store: fail() does not wait for readers
    monkeypatch.setattr(departures, "_run", departures._Run(board, run, 0))
    yield departures._run
    monkeypatch.setattr(departures, "_run", None)


def test_the_rank_that_failed_is_named_with_its_line(run):
    run.board.put(run.scope, "failed", dict(
        rank=2, line="the loss is nan at epoch 2, step 6 on rank 2; lower --learning_rate"))
    assert departures.why_stopped("Horovod has been shut down") == (
        "stopped because rank 2 failed: the loss is nan at epoch 2, step 6 on rank 2; lower "
        "--learning_rate")


def test_a_rank_gone_without_a_word_is_not_said_to_have_failed(run):
    message = departures.why_stopped("Connection closed by peer")
    assert message.startswith("stopped because another worker ended or stopped responding "
                              "without a word (Connection closed by peer)")
    assert "failed" not in message


def test_a_failure_is_on_the_board_of_its_own_run_only(run):
    departures.fail("corrupt image x.png; replace or remove it")
    assert departures.why_stopped("-") == ("stopped because rank 0 failed: corrupt image x.png; "
                                          "replace or remove it")
    board, other = open_for_run(None)
    assert board.read(f"hvdtrain.departures.{other}", ["failed"]) == {}
