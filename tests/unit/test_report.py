"""`hvdtrain report`'s reading of a run log."""

import pytest

from hvdtrain.errors import UsageError
from hvdtrain.tools import report


def test_a_resumed_runs_repeated_epochs_count_once_the_last_time():
    records = [{"event": "start"}, {"event": "epoch", "epoch": 1, "metrics": {"loss": 3}},
               {"event": "epoch", "epoch": 2, "metrics": {"loss": 2}},
               {"event": "start"}, {"event": "epoch", "epoch": 2, "metrics": {"loss": 1.5}},
               {"event": "epoch", "epoch": 3, "metrics": {"loss": 1}}, {"event": "end"}]
    by_epoch = report.epochs(records)
    assert list(by_epoch) == [1, 2, 3] and by_epoch[2]["metrics"]["loss"] == 1.5


@pytest.mark.parametrize("content, message", [
    (None, "no log.jsonl in"),
    ("not json\n", "is not JSON lines"),
    ('{"event": "start"}\n', "has no finished epoch yet"),
])
def test_bad_run_directories_are_named(tmp_path, content, message):
    if content is not None:
        (tmp_path / "log.jsonl").write_text(content)
    with pytest.raises(UsageError, match=message):
        report.write(tmp_path)


def test_a_report_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "log.jsonl").write_text(
        '{"event": "start"}\n{"event": "epoch", "epoch": 1, "metrics": {"loss": 1}}\n')
    (tmp_path / report.FILE).mkdir()   # where the plot would go
    with pytest.raises(UsageError, match=f"cannot write {tmp_path / report.FILE} "):
        report.write(tmp_path)
