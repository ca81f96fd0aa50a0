import numpy as np
import pytest

from hvdtrain import recipe
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


def test_recipes_are_found_by_name():
    assert "digits_cnn" in recipe.available()
    assert recipe.get("digits_cnn").name == "digits_cnn"


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown recipe 'nope'; choose one of: .*digits_cnn"):
        recipe.get("nope")


def test_digits_split_is_fixed_disjoint_and_complete():
    digits = recipe.get("digits_cnn")
    first = digits.load_data(TrainConfig(seed=1))
    second = digits.load_data(TrainConfig(seed=2))
    (x_train, y_train), (x_val, y_val) = first.train, first.validation
    assert x_train.shape == (1438, 8, 8, 1) and x_val.shape == (359, 8, 8, 1)
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_val)) == set(range(10))
    np.testing.assert_array_equal(x_val, second.validation[0])
    assert len(y_train) + len(y_val) == 1797
