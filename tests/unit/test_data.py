"""Data sources in one process (size 1)."""

import numpy as np
import pytest
import tensorflow as tf

import hvdtrain
import tfds_data
from hvdtrain import data
from hvdtrain.data import image_headers, input_errors
from hvdtrain.errors import UsageError


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


def test_synthetic_repeats_one_batch_for_the_given_steps():
    synthetic = data.synthetic((4, 4, 3), num_classes=5, batch_size=8, steps=3)
    batches = list(synthetic.for_epochs(2))
    assert len(batches) == 6 and synthetic.steps == 3
    features, labels = batches[0]
    assert features.shape == (8, 4, 4, 3) and labels.shape == (8,)
    assert 0 <= int(np.min(labels)) and int(np.max(labels)) < 5
    np.testing.assert_array_equal(batches[5][0], features)


def test_arrays_reshuffle_each_epoch_reproducibly():
    ids = np.arange(20)
    first = data.from_arrays((ids, ids), 5, training=True, seed=3)
    again = data.from_arrays((ids, ids), 5, training=True, seed=3)
    epochs = [[int(i) for x, _ in first.batches(e) for i in x.numpy()] for e in (0, 1)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(20))
    assert epochs[0] != epochs[1]
    assert epochs[1] == [int(i) for x, _ in again.batches(1) for i in x.numpy()]


# Bad data: one line naming the file and the fix, without TensorFlow's node names.

def assert_one_clean_line(message, path):
    assert str(path) in message and "\n" not in message, message
    assert not any(noise in message for noise in ("node", "{{", "[[", "Op:", "Traceback"))


def write_folder(root, images):
    """images: {"class/name.png": uint8 array}; PNG or JPEG by the suffix."""
    for name, image in images.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        encode = tf.io.encode_png if name.endswith(".png") else tf.io.encode_jpeg
        tf.io.write_file(str(root / name), encode(image))
    return root


def image_folder(root, sizes=((4, 4),) * 4):
    return write_folder(root, {f"class{i % 2}/{i}.{'png' if i % 3 else 'jpg'}":
                               np.full((*size, 3), i, np.uint8) for i, size in enumerate(sizes)})


def damage_inside(path):
    """Flips a byte of a PNG's compressed data: header and end intact."""
    content = bytearray(path.read_bytes())
    content[content.find(b"IDAT") + 6] ^= 0xFF
    path.write_bytes(bytes(content))


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[:len(b) // 2], "JPEG file cut short: no end-of-image marker at its end"),
    (lambda b: b"", "the file is empty"),
    (lambda b: b"<html>not found</html>", "not a JPEG, PNG, BMP or GIF file"),
], ids=["truncated jpeg", "empty", "not an image"])
def test_a_corrupt_jpeg_is_named_before_training(tmp_path, damage, reason):
    root = image_folder(tmp_path)
    bad = root / "class0" / "0.jpg"
    bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(UsageError) as error:
        data.from_image_folder(root, 2, training=True)
    assert str(error.value) == f"corrupt image {bad} ({reason}); replace or remove it"


def test_a_truncated_png_is_named_before_training(tmp_path):
    root = image_folder(tmp_path)
    bad = root / "class1" / "1.png"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(UsageError, match="PNG file cut short") as error:
        data.from_image_folder(root, 2, training=True)
    assert_one_clean_line(str(error.value), bad)


def test_mixed_image_sizes_name_the_odd_file_and_the_real_way_to_resize(tmp_path):
    root = image_folder(tmp_path, sizes=[(4, 4), (4, 4), (7, 3), (4, 4)])
    with pytest.raises(UsageError) as error:
        data.from_image_folder(root, 2, training=True)
    assert str(error.value) == (
        f"images of different sizes: {root}/class0/2.png is 7x3 (height x width), the first, "
        f"{root}/class0/0.jpg, is 4x4; resize the files to one size, or have the recipe resize "
        "them with from_image_folder(..., image_size=(HEIGHT, WIDTH))")
    data.from_image_folder(root, 2, training=True, image_size=(4, 4))  # resized: no error


def test_an_image_damaged_inside_is_named_when_training_meets_it(tmp_path):
    root = image_folder(tmp_path)
    bad = root / "class1" / "1.png"
    damage_inside(bad)
    images = data.from_image_folder(root, 2, training=True)  # its header is whole
    with pytest.raises(tf.errors.OpError) as raised:
        list(images.batches(0))
    error = input_errors.usage_error(raised.value, images)
    assert str(error) == f"corrupt image {bad} (Invalid PNG data, size 77); replace or remove it"


def write_records(path, ids, feature="id"):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in ids:
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                feature: tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
            })).SerializeToString())


def parse_id(record, seed):
    example = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})
    return example["id"], example["id"] % 2


def records_error(tmp_path, damage=None, feature="id"):
    for i in range(3):
        write_records(tmp_path / f"part-{i}.tfrecord", range(10 * i, 10 * i + 10),
                      feature if i == 1 else "id")
    bad = tmp_path / "part-1.tfrecord"
    if damage:
        bad.write_bytes(damage(bad.read_bytes()))
    with pytest.raises(UsageError) as error:
        data.from_tfrecords(str(tmp_path / "part-*.tfrecord"), parse_id, 4, training=True)
    assert_one_clean_line(str(error.value), bad)
    return str(error.value).replace(str(bad), "FILE")


def flip(byte):
    return lambda content: content[:byte] + bytes([content[byte] ^ 0xFF]) + content[byte + 1:]


def test_a_truncated_tfrecord_file_is_told_from_a_corrupt_one(tmp_path):
    assert records_error(tmp_path, lambda content: content[:-7]) == (
        "TFRecord file FILE is truncated (it ends inside the record at byte 279); replace it "
        "with a complete copy or remove it")
    assert records_error(tmp_path, flip(30)) == (
        "TFRecord file FILE is corrupt (a checksum fails at byte 12); replace or remove it")
    assert records_error(tmp_path, flip(3)) == (
        "TFRecord file FILE is corrupt (not a TFRecord file); replace or remove it")


# The last record of part-1 starts at byte 279: its length (8 bytes), their
# checksum (4), its 15 bytes of data, their checksum (4).
@pytest.mark.parametrize("end", [279 + 5, 279 + 10, 279 + 20, 279 + 29],
                         ids=["in the length", "in its checksum", "in the data",
                              "in the data's checksum"])
def test_a_tfrecord_file_cut_anywhere_in_its_last_record_is_named(tmp_path, end):
    assert records_error(tmp_path, lambda content: content[:end]) == (
        "TFRecord file FILE is truncated (it ends inside the record at byte 279); replace it "
        "with a complete copy or remove it")


def test_tfrecords_off_the_parse_functions_features_are_named_before_training(tmp_path):
    assert records_error(tmp_path, feature="label") == (
        "TFRecord file FILE has a record the recipe's parse function cannot read (Feature: id "
        "(data type: int64) is required but could not be found.); check that the files hold "
        "the features it parses")


def test_a_record_further_in_off_the_features_is_named_when_training_meets_it(tmp_path):
    write_records(tmp_path / "part-0.tfrecord", range(10))
    bad = tmp_path / "part-1.tfrecord"
    with tf.io.TFRecordWriter(str(bad)) as writer:  # a good first record, then another kind
        for feature in ("id", "label"):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                feature: tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))
            })).SerializeToString())
    records = data.from_tfrecords(str(tmp_path / "part-*.tfrecord"), parse_id, 4, training=True)
    with pytest.raises(tf.errors.OpError) as raised:
        list(records.batches(0))
    message = str(input_errors.usage_error(raised.value, records))
    assert message.startswith(f"TFRecord file {bad} has a record the recipe's parse function "
                              "cannot read (Feature: id")
    assert_one_clean_line(message, bad)


def test_errors_outside_input_pipelines_are_left_alone():
    ids = np.arange(8)
    arrays = data.from_arrays((ids, ids), 4, training=True)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        tf.reshape(tf.range(3), [2])
    assert input_errors.usage_error(raised.value, arrays) is None


def test_a_damaged_tfds_file_is_named_with_how_to_prepare_it_again(tmp_path):
    examples = [{"image": np.full((28, 28, 1), i, np.uint8), "label": i % 10} for i in range(40)]
    builder = tfds_data.write("mnist", tmp_path, {"train": examples})
    bad = builder.data_path / "mnist-train.tfrecord-00001-of-00004"
    bad.write_bytes(bad.read_bytes()[:-9])
    digits = data.from_tfds("mnist", "train", 4, training=True, builder=builder,
                            preprocess=lambda example, seed: (example["image"], example["label"]))
    with pytest.raises(tf.errors.OpError) as raised:
        list(digits.batches(0))
    assert str(input_errors.usage_error(raised.value, digits)) == (
        f"TFDS dataset mnist has a damaged file {bad} (truncated record at 1152: Read less bytes "
        f"than requested); prepare it again: tfds build mnist --data_dir={tmp_path} --overwrite")


def test_a_check_failing_inside_a_pipeline_in_fit_gives_its_own_message_alone():
    import keras

    def checked(x):
        with tf.control_dependencies([tf.debugging.assert_less(
                x, tf.constant(2, tf.int64), message="ids must be below 2")]):
            x = tf.cast(x[tf.newaxis], tf.float32)
        return x, x

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(loss="mse")
    with pytest.raises(tf.errors.OpError) as raised:
        model.fit(tf.data.Dataset.range(4).map(checked).batch(1), verbose=0)
    assert str(input_errors.usage_error(raised.value)) == (
        "reading the input data failed (ids must be below 2); check the data and the recipe's "
        "load_data")


def test_arrays_of_different_lengths_are_named():
    with pytest.raises(UsageError) as error:
        data.from_arrays(({"dense": np.zeros(10), "ids": np.zeros(10)}, np.zeros(9)), 2,
                         training=True)
    assert str(error.value) == ("arrays of different lengths (0/dense: 10, 0/ids: 10, 1: 9); "
                                "give every feature and the labels one row per example")


@pytest.mark.parametrize("kind", ["BMP", "GIF", "JPEG", "PNG"])
def test_headers_give_the_size_tensorflow_decodes(tmp_path, kind):
    image_module = pytest.importorskip("PIL.Image")  # only to write the files
    path = tmp_path / f"image.{kind.lower()}"
    image_module.fromarray(np.zeros((5, 7, 3), np.uint8)).save(path, kind, progressive=True)
    decoded = tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False)
    assert image_headers.size(path) == tuple(decoded.shape[:2]) == (5, 7)


def test_a_tfrecord_file_gone_while_training_is_named_as_unreadable(tmp_path):
    for i in range(2):
        write_records(tmp_path / f"part-{i}.tfrecord", range(10))
    records = data.from_tfrecords(str(tmp_path / "part-*.tfrecord"), parse_id, 4, training=True)
    gone = tmp_path / "part-1.tfrecord"
    gone.unlink()
    with pytest.raises(tf.errors.OpError) as raised:
        list(records.batches(0))
    message = str(input_errors.usage_error(raised.value, records))
    assert message.startswith(f"cannot read TFRecord file {gone} (")
    assert message.endswith("); check that it exists and is readable")
    assert_one_clean_line(message, gone)
