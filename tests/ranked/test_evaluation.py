"""Distributed evaluation equals a single-process evaluation of the whole
split; the statistics each replica keeps of its own batches become one."""

import json

import pytest

from launch import run, worker
from ranked.support import computed_once, gathered
from workers import evaluate

EXAMPLES = [101, 96]


def _single_process_evaluations(out):
    result = run([*worker("evaluate"), out, *EXAMPLES])
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def references():
    """Each split's evaluation by one process alone."""
    return computed_once("evaluation-references", _single_process_evaluations)


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.parametrize("examples", EXAMPLES)
def test_uneven_split_evaluates_exactly(examples, references):
    # 101: shards of 51 and 50 examples, 7 batches each, the last ones short.
    np2 = gathered(evaluate.run(examples))[0]["results"]   # rank 0's, as it wrote them
    np1 = json.loads((references / f"np1.{examples}.json").read_text())["results"]
    assert set(np2) == set(np1) == {"loss", "accuracy", "sparse_top_k_categorical_accuracy"}
    for name in np1:
        assert np2[name] == pytest.approx(np1[name], rel=1e-6), name


@pytest.mark.launches(controllers=("gloo",))
def test_the_replicas_statistics_become_their_average_and_frozen_weights_stay():
    import horovod.tensorflow as hvd
    import keras
    import numpy as np

    from hvdtrain.parallel.data_parallel.statistics import average_statistics

    keras.utils.set_random_seed(0)   # the same frozen weights on every rank, as broadcast
    inputs = keras.Input((3,))
    frozen = keras.layers.Dense(2, trainable=False, name="frozen")
    model = keras.Model(inputs, frozen(keras.layers.BatchNormalization(name="norm")(inputs)))
    norm = model.get_layer("norm")
    # Each rank's own batches gave it its own moving statistics.
    norm.moving_mean.assign(np.full(3, 1.0 + hvd.rank(), "float32"))
    norm.moving_variance.assign(np.full(3, 0.1 * (1 + hvd.rank()), "float32"))
    kernel = np.asarray(frozen.kernel.numpy())
    average_statistics(model)
    np.testing.assert_allclose(norm.moving_mean.numpy(), 1.5, rtol=1e-7)
    np.testing.assert_allclose(norm.moving_variance.numpy(), 0.15, rtol=1e-6)
    for value in gathered(norm.moving_variance.numpy()):
        np.testing.assert_array_equal(value, norm.moving_variance.numpy())
    np.testing.assert_array_equal(frozen.kernel.numpy(), kernel)
