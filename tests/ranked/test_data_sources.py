"""File, image-folder and TFDS sources at np=2: whole files per worker, each
example read at most once per epoch, the same steps everywhere, exact
evaluation coverage, and bad data refused on every rank."""

import pytest

from launch import REPO, hvdtrain_command
from ranked.support import error_lines, gathered, on_rank_0
from sample_files import write_images, write_tfrecords
from workers import read_source

# Each test ran one horovodrun (no controller named: Gloo).
pytestmark = pytest.mark.launches(controllers=("gloo",))


@pytest.fixture
def read(capfd, caplog):
    """read(SOURCE, PATH, *OPTIONS) on every rank: [rank 0's read, rank 1's],
    and what the ranks printed and logged meanwhile (absl's log reaches
    stderr only once absl's handler is set up, as `hvdtrain` does; caplog
    has it either way)."""
    def read(source, path, *options):
        capfd.readouterr()
        caplog.clear()
        reads = gathered(read_source.read(source, path, *options))
        out, err = capfd.readouterr()
        return reads, "".join(gathered(out + err + caplog.text))
    return read


def test_tfrecord_files_are_read_whole_once_per_epoch(shared_tmp_path, read):
    pattern = on_rank_0(write_tfrecords, shared_tmp_path / "records", [10, 11, 12, 13, 14])
    (rank0, rank1), _ = read("tfrecords", pattern)
    # Rank 0 reads files 0, 2, 4 (36 records), rank 1 files 1, 3 (24): 6 batches of 4 each.
    assert rank0["steps"] == rank1["steps"] == 6
    assert rank0["dropped"] == 60 - 2 * 24 and rank0["examples"] == 60
    files_of_rank0 = set(range(10)) | set(range(21, 33)) | set(range(46, 60))
    for epoch in (0, 1):
        ids0, ids1 = rank0["epochs"][epoch], rank1["epochs"][epoch]
        assert len(ids0) == len(set(ids0)) == len(ids1) == len(set(ids1)) == 24
        assert set(ids0) <= files_of_rank0 and not set(ids1) & files_of_rank0
    assert rank0["epochs"][0] != rank0["epochs"][1]  # reshuffled
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == list(range(60))


def test_order_is_reproducible_when_deterministic(shared_tmp_path, read):
    pattern = on_rank_0(write_tfrecords, shared_tmp_path / "records", [20, 20, 20, 20])
    first, _ = read("tfrecords", pattern, "deterministic")
    second, _ = read("tfrecords", pattern, "deterministic")
    assert [r["epochs"] for r in first] == [r["epochs"] for r in second]


def test_fewer_files_than_workers_falls_back_to_every_nth_record(shared_tmp_path, read):
    pattern = on_rank_0(write_tfrecords, shared_tmp_path / "records", [21])
    (rank0, rank1), output = read("tfrecords", pattern)
    assert "has 1 files for 2 workers" in output
    assert rank0["steps"] == rank1["steps"] == 2
    assert not set(rank0["epochs"][0]) & set(rank1["epochs"][0])
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == list(range(21))


def test_image_folder_is_sharded_by_file_with_labels_from_folders(shared_tmp_path, read):
    root = on_rank_0(write_images, shared_tmp_path / "images", per_class=5)
    (rank0, rank1), _ = read("images", root)
    every_id = {i + 100 * label for label in (0, 1) for i in range(5)}
    assert rank0["steps"] == rank1["steps"] == 1 and rank0["dropped"] == 2
    assert not set(rank0["epochs"][0]) & set(rank1["epochs"][0])
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == sorted(every_id)


def test_mixed_image_sizes_are_resized_when_asked(shared_tmp_path, read):
    root = on_rank_0(write_images, shared_tmp_path / "images", per_class=4,
                     sizes=((4, 4), (7, 3)))
    (rank0, rank1), _ = read("images", root, "resize")
    assert len(rank0["evaluated"] + rank1["evaluated"]) == 8


def test_tfds_files_are_read_whole_by_each_worker(shared_tmp_path, read):
    (rank0, rank1), output = read("tfds", str(shared_tmp_path / "tfds"))
    # 8 files of 180, 180, 179, 180, 180, 179, 180, 180 examples: 719 per worker.
    assert rank0["steps"] == rank1["steps"] == 719 // 4
    assert len(rank0["evaluated"]) == len(rank1["evaluated"]) == 719
    assert "instead of whole files" not in output


PEER = "hvdtrain: error: stopped because rank "


def _one_error_line(finished):
    """The one error the ranks report (a rank whose peer failed first says so)."""
    errors = {text for result in finished for text in result.output.splitlines()
              if text.startswith("hvdtrain: error:") and not text.startswith(PEER)}
    output = "".join(result.output[-2000:] for result in finished)
    assert any(result.status != 0 for result in finished) and len(errors) == 1, output
    assert not any("Traceback" in result.stderr for result in finished)
    return errors.pop()


def _every_rank_says(finished, line):
    """Both ranks printed `line` as their error, and exited with status 2."""
    output = "".join(result.output[-3000:] for result in finished)
    errors = error_lines(finished)
    assert errors == {0: line, 1: line}, output
    assert [result.status for result in finished] == [2, 2], output
    assert not any("Traceback" in result.output for result in finished)


def _train(capfd, recipe, data_dir, shared_tmp_path):
    """`hvdtrain train` of a test recipe on every rank: [rank 0's Finished, rank 1's]."""
    return gathered(hvdtrain_command(
        capfd, "train", f"--recipe={REPO / 'tests' / 'recipes' / recipe}",
        f"--data_dir={data_dir}", f"--model_dir={shared_tmp_path / 'model'}"))


@pytest.mark.timeout(120)
def test_corrupt_tfrecord_is_reported_by_every_rank(shared_tmp_path, capfd):
    def write():
        pattern = write_tfrecords(shared_tmp_path / "records", [10, 10, 10])
        path = shared_tmp_path / "records" / "part-001.tfrecord"  # rank 1's file
        path.write_bytes(path.read_bytes()[:-7])
        return pattern, path

    pattern, path = on_rank_0(write)
    _every_rank_says(_train(capfd, "records.py", pattern, shared_tmp_path), (
        f"hvdtrain: error: TFRecord file {path} is truncated (it ends inside the record at byte "
        "279); replace it with a complete copy or remove it (found by rank 1)"))


@pytest.mark.timeout(120)
def test_mixed_image_sizes_name_the_odd_file_on_every_rank(shared_tmp_path, capfd):
    root = on_rank_0(write_images, shared_tmp_path / "images", per_class=4,
                     sizes=((4, 4), (7, 3)))
    _every_rank_says(_train(capfd, "images.py", root, shared_tmp_path), (
        f"hvdtrain: error: images of different sizes: {root}/class0/1.png is 7x3 (height x "
        f"width), the first, {root}/class0/0.png, is 4x4; resize the files to one size, or have "
        "the recipe resize them with from_image_folder(..., image_size=(HEIGHT, WIDTH)) "
        "(found by rank 1)"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["empty glob", "missing tfds dataset"])
def test_bad_data_ends_the_job_with_one_clear_line(shared_tmp_path, capfd, case):
    if case == "empty glob":
        finished = _train(capfd, "records.py", shared_tmp_path / "none-*.tfrecord",
                          shared_tmp_path)
        assert "no files match" in _one_error_line(finished)
    else:
        finished = _train(capfd, "tfds_mnist.py", shared_tmp_path / "empty", shared_tmp_path)
        assert "TFDS dataset mnist is not prepared in" in _one_error_line(finished)
