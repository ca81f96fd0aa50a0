"""The model directory is checked before a run starts anything expensive."""

import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.run import trainer
from hvdtrain.state.model_dir import check_usable, check_writable_file


def test_a_directory_that_can_be_made_passes_and_nothing_is_left_behind(tmp_path):
    check_usable(tmp_path / "a" / "b")
    check_usable(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, where, message", [
    ("--model_dir", "file", "is a file, not a directory"),
    ("--model_dir", "file/run", "is under {tmp}/file, a file, not a directory"),
    ("--model_dir", "/proc/hvdtrain-run", "cannot be written (/proc: "),
    ("--output", "dir", "is a directory; name a file to write, such as {tmp}/dir/evaluation.json"),
    ("--output", "file/out.json", "is under {tmp}/file, a file, not a directory"),
    ("--output", "/proc/evaluation.json", "cannot be written (/proc: "),
])
def test_a_place_that_cannot_be_written_is_named_with_the_fix(tmp_path, flag, where, message):
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    path = where if where.startswith("/") else tmp_path / where
    with pytest.raises(UsageError) as error:
        if flag == "--model_dir":
            check_usable(path)
        else:
            check_writable_file(path, flag)
    assert message.format(tmp=tmp_path) in str(error.value)
    assert str(error.value).startswith(f"{flag}={path} ")


def test_the_python_api_checks_it_before_horovod_starts(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        trainer.train(TrainConfig(model_dir=str(tmp_path / "file")))


def test_an_output_file_that_can_be_written_passes_and_nothing_is_left_behind(tmp_path):
    check_writable_file(tmp_path / "new" / "evaluation.json", "--output")
    assert list(tmp_path.iterdir()) == []
