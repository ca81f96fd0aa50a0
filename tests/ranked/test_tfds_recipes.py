"""cifar10_resnet and text_transformer at np=2 on small datasets written in
TFDS's own format (tests/tfds_data.py): they learn, each worker reads whole
files, the sparse and dense embedding reductions agree, and a dataset that
cannot be downloaded ends every rank with one line."""

import re

import keras
import numpy as np
import pytest

import tfds_data
from launch import REPO, hvdtrain_command
from ranked.support import error_lines, gathered, on_rank_0

TINY_TRANSFORMER = ["--option=vocab_size=1024", "--option=sequence_length=48",
                    "--option=d_model=32", "--option=layers=1", "--option=heads=2",
                    "--option=mlp_dim=64"]
EPOCHS, STEPS = 2, 16  # 1024 reviews: 512 per worker, in batches of 32
CIFAR10_SCRIPT = REPO / "recipes" / "cifar10_resnet.py"


def _write(name, data_dir, splits):
    """tfds_data.write, in a directory every rank sees."""
    tfds_data.write(name, data_dir, splits)


def _summary(recipe, output):
    found = re.search(rf"{recipe} on 2 workers, \d+ epochs in [\d.]+ s: val_accuracy (\d\.\d+)",
                      output)
    assert found, output[-3000:]
    return float(found.group(1))


# Each test ran one horovodrun (no controller named: Gloo) unless it says otherwise.
@pytest.mark.slow
@pytest.mark.launches(controllers=("gloo",))
def test_cifar10_resnet_learns_from_the_recipe_script(shared_tmp_path, capfd):
    on_rank_0(_write, "cifar10", shared_tmp_path / "data", {
        "train": tfds_data.cifar10_examples(1280), "test": tfds_data.cifar10_examples(320, seed=1)})
    finished = gathered(hvdtrain_command(
        capfd, f"--data_dir={shared_tmp_path / 'data'}", f"--model_dir={shared_tmp_path / 'model'}",
        "--option=depth=8", "--epochs=2", "--batch_size=32", "--warmup_epochs=1",
        "--intra_op_threads=1", "--export=false", script=CIFAR10_SCRIPT))
    stdout = "".join(result.stdout for result in finished)
    output = "".join(result.output for result in finished)
    assert [result.status for result in finished] == [0, 0], output[-3000:]
    # 10 classes: chance is 0.1.
    assert _summary("cifar10_resnet", stdout) > 0.5
    # 4 files per split: each worker reads 2 whole files, 640 images, 20 batches.
    assert "global batch 64; 20 steps per epoch; 0 of 1280 training examples left out" in output
    assert "each worker reads an even part" not in output
    assert re.search(r"hvdtrain: throughput [\d.]+ images/s", stdout), stdout[-2000:]


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.timeout(180)
def test_cifar10_that_cannot_be_downloaded_ends_every_rank_with_one_line(shared_tmp_path, capfd,
                                                                         monkeypatch):
    # TFDS retries a failed download 10 times with exponential back-off
    # (about 3.5 minutes here before it gives up); with no retries the same
    # failure comes at once. TFDS reads the setting at each download, and
    # monkeypatch restores it after the test. The recipe's own entry point
    # runs unchanged after that.
    from tensorflow_datasets.core.download import downloader

    monkeypatch.setattr(downloader, "MAX_RETRIES", 0)
    finished = gathered(hvdtrain_command(
        capfd, f"--data_dir={shared_tmp_path}", f"--model_dir={shared_tmp_path / 'model'}",
        "--intra_op_threads=1", script=CIFAR10_SCRIPT))
    output = "".join(result.output[-3000:] for result in finished)
    assert any(result.status != 0 for result in finished)
    errors = error_lines(finished)
    assert set(errors) == {0, 1}, output
    assert len(set(errors.values())) == 1
    line = errors[0]
    assert "could not download TFDS dataset cifar10" in line and "--data_dir=DIR" in line
    assert [result.status for result in finished] == [2, 2], output  # each rank's exit
    assert not any("Traceback" in result.output for result in finished)


def _train_transformer(capfd, directory, name, *flags):
    """The run's result on each rank, trained model, and the allgathers in
    Horovod's timeline of all its training steps."""
    model_dir = directory / name
    finished = gathered(hvdtrain_command(
        capfd, "train", "--recipe=text_transformer", f"--data_dir={directory / 'data'}",
        f"--model_dir={model_dir}", *TINY_TRANSFORMER, f"--epochs={EPOCHS}", "--batch_size=32",
        "--learning_rate=2e-3", "--warmup_epochs=0.5", "--deterministic", "--seed=3",
        "--intra_op_threads=1", f"--timeline_steps=1:{EPOCHS * STEPS}", *flags))
    assert [result.status for result in finished] == [0, 0], "".join(
        result.output[-3000:] for result in finished)
    timeline = (model_dir / "timeline.json").read_text()
    allgathers = len(re.findall(r'"ph": "B", "name": "ALLGATHER"', timeline))
    return finished, keras.saving.load_model(model_dir / "model.keras", compile=False), allgathers


# It ran its horovodruns under MPI.
@pytest.mark.slow
@pytest.mark.launches(controllers=("mpi",))
def test_text_transformer_allgathered_and_dense_embedding_gradients_train_alike(shared_tmp_path,
                                                                                capfd):
    from hvdtrain.recipes import text_transformer  # noqa: F401  (its layer, for loading)

    on_rank_0(_write, "imdb_reviews", shared_tmp_path / "data", {
        "train": tfds_data.imdb_reviews_examples(1024),
        "test": tfds_data.imdb_reviews_examples(256, seed=1)})
    sparse, sparse_model, sparse_gathers = _train_transformer(capfd, shared_tmp_path, "sparse")
    dense, dense_model, dense_gathers = _train_transformer(capfd, shared_tmp_path, "dense",
                                                           "--sparse_as_dense")
    # The embedding's gradient went through an allgather (values and indices)
    # at every step without --sparse_as_dense, and through none with it.
    assert sparse_gathers - dense_gathers == 2 * EPOCHS * STEPS
    # Two classes: chance is 0.5.
    for finished in (sparse, dense):
        stdout = "".join(result.stdout for result in finished)
        assert _summary("text_transformer", stdout) > 0.8
        assert re.search(r"hvdtrain: throughput [\d.]+ sequences/s", stdout)
    # The same data, initial weights and dropout masks: only the order of
    # additions differs (rows summed within each rank first, or after the
    # allgather), so weights agree to rounding. Except the attention's key
    # bias: it adds the same to every score of a query, which the softmax
    # cancels, so its true gradient is 0 and what it gets is rounding noise,
    # which Adam's normalization enlarges (to about 1e-3 of the learning
    # rate per step, where its epsilon takes over).
    for mine, theirs in zip(sparse_model.weights, dense_model.weights):
        atol = 1e-4 if mine.path.endswith("key/bias") else 1e-6
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=atol,
                                   err_msg=mine.path)
