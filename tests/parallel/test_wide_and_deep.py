"""The wide_and_deep recipe at np=2: it learns the synthetic click log's
planted signal with allgathered and with dense embedding gradients, to the
same model; it trains on TFRecord files in its documented schema; a record
off the schema stops every rank with one line."""

import re
import sys

import numpy as np
import pytest

from launch import horovodrun, rank_lines

TINY = ["--option=table_rows=8192", "--option=embedding_dim=8", "--option=hidden_units=64,32",
        "--batch_size=128", "--intra_op_threads=1"]
# Plain SGD: Adam divides each step by the gradient's running RMS, so a row
# whose gradients cancel to about 0 takes a full step of either sign on the
# last bit of round-off, and the two reductions' different summation orders
# would part by ~1e-2 in such rows. SGD keeps them to round-off.
SYNTHETIC = [*TINY, "--option=synthetic_examples=16000", "--epochs=2", "--deterministic",
             "--optimizer=sgd", "--momentum=0", "--learning_rate=0.3"]
# The hidden model's own validation AUC is about 0.8; these settings reach about 0.71.
SYNTHETIC_AUC = 0.65


def val_auc(result):
    found = re.search(r"wide_and_deep on 2 workers, \d+ epochs? in [\d.]+ s: .*val_auc (\d\.\d+)",
                      result.stdout)
    assert result.returncode == 0 and found, result.stdout[-3000:] + result.stderr[-3000:]
    return float(found.group(1))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same deterministic training twice: the recipe script under Gloo
    with allgathered embedding gradients, and `hvdtrain train` under MPI
    with --sparse_as_dense."""
    root = tmp_path_factory.mktemp("wide_and_deep")
    allgathered = horovodrun([sys.executable, "recipes/wide_and_deep.py", *SYNTHETIC,
                              f"--model_dir={root / 'allgathered'}"])
    dense = horovodrun(["hvdtrain", "train", "--recipe=wide_and_deep", *SYNTHETIC,
                        "--sparse_as_dense", f"--model_dir={root / 'dense'}"], controller="mpi")
    return root, allgathered, dense


def test_learns_the_planted_signal_with_allgathered_and_dense_gradients(two_runs):
    _, allgathered, dense = two_runs
    assert val_auc(allgathered) > SYNTHETIC_AUC
    assert val_auc(dense) > SYNTHETIC_AUC


def test_allgathered_and_dense_gradients_give_the_same_model(two_runs):
    import keras

    from hvdtrain.recipes import wide_and_deep  # noqa: F401  (registers its layers)

    root, allgathered, dense = two_runs
    for result in (allgathered, dense):
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    models = [keras.saving.load_model(root / name / "model.keras", compile=False)
              for name in ("allgathered", "dense")]
    for a, b in zip(*(m.weights for m in models)):
        assert a.path == b.path
        # Equal to round-off, not bit for bit: a row looked up several times
        # sums its gradients in another order (all ranks' rows at once when
        # allgathered, each rank's first when dense).
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6, err_msg=a.path)


def write_click_files(directory, prefix, files, records_per_file, seed):
    """Records in the documented schema whose clicks follow categorical
    feature 0: ids below 10 click 90% of the time, the others 10%."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    for number in range(files):
        with tf.io.TFRecordWriter(str(directory / f"{prefix}-{number:05d}.tfrecord")) as writer:
            for _ in range(records_per_file):
                categorical = rng.integers(0, 2**32, 26)
                categorical[0] = rng.integers(0, 20)
                label = int(rng.random() < (0.9 if categorical[0] < 10 else 0.1))
                values = {"label": [label], "dense": rng.integers(0, 100, 13),
                          "categorical": categorical}
                feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))
                           for key, v in values.items()}
                writer.write(tf.train.Example(
                    features=tf.train.Features(feature=feature)).SerializeToString())


def test_trains_on_tfrecord_files_in_the_documented_schema(tmp_path):
    write_click_files(tmp_path, "train", files=4, records_per_file=1000, seed=0)
    write_click_files(tmp_path, "eval", files=2, records_per_file=250, seed=1)
    result = horovodrun(["hvdtrain", "train", "--recipe=wide_and_deep", *TINY, "--epochs=1",
                         "--batch_size=32", "--learning_rate=0.01", f"--data_dir={tmp_path}",
                         f"--model_dir={tmp_path / 'model'}", "--export=false"])
    # The planted rule's own AUC is 0.9: reaching it means features and labels were read together.
    assert val_auc(result) > 0.8
    assert "62 steps per epoch; 32 of 4000 training examples left out" in result.stderr


def test_a_record_off_the_schema_stops_every_rank_with_one_line(tmp_path):
    import tensorflow as tf

    write_click_files(tmp_path, "train", files=4, records_per_file=100, seed=0)
    write_click_files(tmp_path, "eval", files=2, records_per_file=50, seed=1)
    # A record with 12 dense values, in a file the second rank checks.
    bad = tmp_path / "train-00001.tfrecord"
    with tf.io.TFRecordWriter(str(bad)) as writer:
        feature = {"label": [1], "dense": list(range(12)), "categorical": list(range(26))}
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            key: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
            for key, v in feature.items()})).SerializeToString())
    result = horovodrun(["hvdtrain", "train", "--recipe=wide_and_deep", *TINY,
                         f"--data_dir={tmp_path}", f"--model_dir={tmp_path / 'model'}"],
                        timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    errors = {rank: text for rank, text in rank_lines(output) if "hvdtrain: error:" in text}
    assert set(errors) == {0, 1} and len(set(errors.values())) == 1, output[-3000:]
    assert f"{bad} has a record off the schema" in errors[0]
    assert "(found by rank 1)" in errors[0]
    assert re.search(r"Process \d exit with status code 2", output), output[-3000:]
    assert not any("Traceback" in text for _, text in rank_lines(output))


def test_synthetic_shards_differ_between_ranks_and_cover_the_log():
    script = (
        "import hvdtrain, numpy as np\n"
        "from hvdtrain import recipe\n"
        "from hvdtrain.recipes import wide_and_deep\n"
        "hvdtrain.init()\n"
        "config = recipe.make_config('wide_and_deep', {'synthetic_examples': 2000},\n"
        "                            batch_size=50)\n"
        "rows = [f['categorical'].numpy() for f, _ in\n"
        "        wide_and_deep.load_data(config).validation.batches()]\n"
        "print('shard', ';'.join(','.join(map(str, r)) for r in np.concatenate(rows)))\n")
    result = horovodrun([sys.executable, "-c", script], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    shards = {rank: set(text.split(" ", 1)[1].split(";"))
              for rank, text in rank_lines(result.stdout) if text.startswith("shard ")}
    # The 200 validation rows of the log: 100 on each rank, none on both.
    assert set(shards) == {0, 1} and len(shards[0]) == len(shards[1]) == 100
    assert not shards[0] & shards[1]
