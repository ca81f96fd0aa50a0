"""File, image-folder and TFDS sources at np=2: whole files per worker, each
example read at most once per epoch, the same steps everywhere, exact
evaluation coverage, and bad data refused on every rank."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from launch import REPO, horovodrun, rank_lines, worker


def write_tfrecords(directory, counts):
    """Files of consecutive ids: counts[i] records in file i."""
    directory.mkdir(parents=True, exist_ok=True)
    next_id = 0
    for i, count in enumerate(counts):
        with tf.io.TFRecordWriter(str(directory / f"part-{i:03d}.tfrecord")) as writer:
            for _ in range(count):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id]))
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature={"id": feature})).SerializeToString())
                next_id += 1
    return str(directory / "part-*.tfrecord")


def write_images(root, per_class, sizes=((4, 4),)):
    """PNGs whose first pixel is their index in their class (id = index + 100 x label)."""
    for label in (0, 1):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(per_class):
            height, width = sizes[i % len(sizes)]
            image = np.full((height, width, 3), i, np.uint8)
            tf.io.write_file(str(root / f"class{label}" / f"{i}.png"), tf.io.encode_png(image))
    return str(root)


def read(tmp_path, source, path, *options):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    result = horovodrun([*worker("read_source"), out, source, path, *options])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], result


def test_tfrecord_files_are_read_whole_once_per_epoch(tmp_path):
    pattern = write_tfrecords(tmp_path / "records", [10, 11, 12, 13, 14])
    (rank0, rank1), _ = read(tmp_path, "tfrecords", pattern)
    # Rank 0 reads files 0, 2, 4 (36 records), rank 1 files 1, 3 (24): 6 batches of 4 each.
    assert rank0["steps"] == rank1["steps"] == 6
    assert rank0["dropped"] == 60 - 2 * 24 and rank0["examples"] == 60
    files_of_rank0 = set(range(0, 10)) | set(range(21, 33)) | set(range(46, 60))
    for epoch in (0, 1):
        ids0, ids1 = rank0["epochs"][epoch], rank1["epochs"][epoch]
        assert len(ids0) == len(set(ids0)) == len(ids1) == len(set(ids1)) == 24
        assert set(ids0) <= files_of_rank0 and not set(ids1) & files_of_rank0
    assert rank0["epochs"][0] != rank0["epochs"][1]  # reshuffled
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == list(range(60))


def test_order_is_reproducible_when_deterministic(tmp_path):
    pattern = write_tfrecords(tmp_path / "records", [20, 20, 20, 20])
    first, _ = read(tmp_path, "tfrecords", pattern, "deterministic")
    second, _ = read(tmp_path, "tfrecords", pattern, "deterministic")
    assert [r["epochs"] for r in first] == [r["epochs"] for r in second]


def test_fewer_files_than_workers_falls_back_to_every_nth_record(tmp_path):
    pattern = write_tfrecords(tmp_path / "records", [21])
    (rank0, rank1), result = read(tmp_path, "tfrecords", pattern)
    assert "has 1 files for 2 workers" in result.stdout + result.stderr
    assert rank0["steps"] == rank1["steps"] == 2
    assert not set(rank0["epochs"][0]) & set(rank1["epochs"][0])
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == list(range(21))


def test_image_folder_is_sharded_by_file_with_labels_from_folders(tmp_path):
    root = write_images(tmp_path / "images", per_class=5)
    (rank0, rank1), _ = read(tmp_path, "images", root)
    every_id = {i + 100 * label for label in (0, 1) for i in range(5)}
    assert rank0["steps"] == rank1["steps"] == 1 and rank0["dropped"] == 2
    assert not set(rank0["epochs"][0]) & set(rank1["epochs"][0])
    assert sorted(rank0["evaluated"] + rank1["evaluated"]) == sorted(every_id)


def test_mixed_image_sizes_are_resized_when_asked(tmp_path):
    root = write_images(tmp_path / "images", per_class=4, sizes=((4, 4), (7, 3)))
    (rank0, rank1), _ = read(tmp_path, "images", root, "resize")
    assert len(rank0["evaluated"] + rank1["evaluated"]) == 8


def test_tfds_files_are_read_whole_by_each_worker(tmp_path):
    (rank0, rank1), result = read(tmp_path, "tfds", str(tmp_path / "tfds"))
    # 8 files of 180, 180, 179, 180, 180, 179, 180, 180 examples: 719 per worker.
    assert rank0["steps"] == rank1["steps"] == 719 // 4
    assert len(rank0["evaluated"]) == len(rank1["evaluated"]) == 719
    assert "instead of whole files" not in result.stdout + result.stderr


PEER = "hvdtrain: error: stopped because another worker failed"


def _one_error_line(result):
    """The one error the ranks report (a rank whose peer failed first says so)."""
    errors = {text for _, text in rank_lines(result.stdout + result.stderr)
              if text.startswith("hvdtrain: error:") and not text.startswith(PEER)}
    assert result.returncode != 0 and len(errors) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert not any("Traceback" in text for _, text in rank_lines(result.stderr))
    return errors.pop()


def _every_rank_says(result, line):
    """Both ranks printed `line` as their error, and exited with status 2."""
    output = result.stdout + result.stderr
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    assert errors == {0: line, 1: line}, output[-3000:]
    assert re.search(r"Process \d exit with status code 2", output), output[-3000:]
    assert not any("Traceback" in text for _, text in rank_lines(output))


def _train(recipe, data_dir, tmp_path):
    return horovodrun(["hvdtrain", "train", f"--recipe={REPO / 'tests' / 'recipes' / recipe}",
                       f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'model'}"], timeout=120)


def test_corrupt_tfrecord_is_reported_by_every_rank(tmp_path):
    pattern = write_tfrecords(tmp_path / "records", [10, 10, 10])
    path = tmp_path / "records" / "part-001.tfrecord"  # rank 1's file
    path.write_bytes(path.read_bytes()[:-7])
    _every_rank_says(_train("records.py", pattern, tmp_path), (
        f"hvdtrain: error: TFRecord file {path} is truncated (it ends inside the record at byte "
        "279); replace it with a complete copy or remove it (found by rank 1)"))


def test_mixed_image_sizes_name_the_odd_file_on_every_rank(tmp_path):
    root = write_images(tmp_path / "images", per_class=4, sizes=((4, 4), (7, 3)))
    _every_rank_says(_train("images.py", root, tmp_path), (
        f"hvdtrain: error: images of different sizes: {root}/class0/1.png is 7x3 (height x "
        f"width), the first, {root}/class0/0.png, is 4x4; resize the files to one size, or have "
        "the recipe resize them with from_image_folder(..., image_size=(HEIGHT, WIDTH)) "
        "(found by rank 1)"))


def test_an_image_damaged_inside_is_named_by_the_rank_that_reads_it(tmp_path):
    root = write_images(tmp_path / "images", per_class=4)
    bad = tmp_path / "images" / "class1" / "3.png"  # rank 1's; its header and end are whole
    content = bytearray(bad.read_bytes())
    content[content.find(b"IDAT") + 6] ^= 0xFF
    bad.write_bytes(bytes(content))
    result = _train("images.py", root, tmp_path)
    output = result.stdout + result.stderr
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    # Found while training: the other rank stops, saying why, if it can before the launcher ends it.
    assert errors[1] == (f"hvdtrain: error: corrupt image {bad} (Invalid PNG data, size 77); "
                         "replace or remove it"), output[-3000:]
    assert errors.get(0, PEER).startswith(PEER), output[-3000:]
    assert "Process 1 exit with status code 2" in output, output[-3000:]
    assert not any("Traceback" in text for _, text in rank_lines(output))


@pytest.mark.parametrize("case", ["empty glob", "missing tfds dataset"])
def test_bad_data_ends_the_job_with_one_clear_line(tmp_path, case):
    if case == "empty glob":
        result = _train("records.py", tmp_path / "none-*.tfrecord", tmp_path)
        assert "no files match" in _one_error_line(result)
    else:
        result = _train("tfds_mnist.py", tmp_path / "empty", tmp_path)
        assert "TFDS dataset mnist is not prepared in" in _one_error_line(result)
