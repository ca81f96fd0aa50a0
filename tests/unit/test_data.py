"""Data sources in one process (size 1)."""

import numpy as np
import pytest

import hvdtrain
from hvdtrain import data


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
