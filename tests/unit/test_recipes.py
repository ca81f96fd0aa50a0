import concurrent.futures

import pytest

import hvdtrain
from hvdtrain import recipe
from hvdtrain.datasets import digits
from hvdtrain.errors import UsageError


def test_recipes_are_found_by_name():
    assert "digits_cnn" in recipe.available()
    assert recipe.get("digits_cnn").name == "digits_cnn"


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(UsageError, match="unknown recipe 'nope'; choose one of: .*digits_cnn"):
        recipe.get("nope")


def test_digits_is_a_tfds_dataset_with_a_fixed_split_in_several_files(tmp_path):
    builder = digits.prepare(tmp_path)
    splits = builder.info.splits
    assert (splits["train"].num_examples, splits["validation"].num_examples) == (1438, 359)
    assert splits["train"].num_shards == splits["validation"].num_shards == 8
    again = digits.prepare(tmp_path / "again")
    labels = [sorted(int(ex["label"]) for ex in b.as_dataset("validation"))
              for b in (builder, again)]
    assert labels[0] == labels[1] and set(labels[0]) == set(range(10))


def test_jobs_that_start_together_build_the_digits_once(tmp_path):
    """Two jobs on a machine whose data directory is still empty (make test's
    workers, say): the second waits for the first's build and reads it."""
    with concurrent.futures.ThreadPoolExecutor(2) as jobs:
        builders = list(jobs.map(lambda _: digits.prepare(tmp_path), range(2)))
    assert all(b.is_prepared() for b in builders)
    assert [p.name for p in (tmp_path / "hvdtrain_digits").iterdir()] == ["1.0.0"]


def test_digits_recipe_reads_all_examples_through_tfds(tmp_path):
    hvdtrain.init()
    config = recipe.make_config("digits_cnn", data_dir=str(tmp_path), batch_size=100)
    splits = recipe.get("digits_cnn").load_data(config)
    assert (splits.train.steps, splits.train.dropped) == (14, 38)
    images, labels = next(iter(splits.train.batches(0)))
    assert images.shape == (100, 8, 8, 1) and images.dtype == "float32"
    assert 0.0 <= float(images.numpy().min()) and float(images.numpy().max()) <= 1.0
    assert sum(int(x.shape[0]) for x, _ in splits.validation.batches()) == 359


def test_options_take_the_type_of_their_default():
    config = recipe.make_config("resnet50_synthetic", ["image_size=64", "model=MobileNetV2"])
    assert config.options == dict(model="MobileNetV2", image_size=64, num_classes=1000,
                                  iterations=10)
    assert recipe.make_config("resnet50_synthetic", {"iterations": 3}).options["iterations"] == 3


@pytest.mark.parametrize("options, message", [
    (["image_sze=64"], "recipe resnet50_synthetic has no option 'image_sze'; its options: "
                       "model, image_size, num_classes, iterations"),
    (["image_size=big"], "--option=image_size=big: expected an integer"),
    (["image_size"], "--option=image_size is not NAME=VALUE"),
    (["=3"], "--option==3 is not NAME=VALUE"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(UsageError) as error:
        recipe.make_config("resnet50_synthetic", options)
    assert message in str(error.value)


def test_boolean_options_read_true_and_false():
    flag = recipe.Recipe("r", None, None, None, options={"on": recipe.Option(False, "")})
    assert recipe.parse_options(flag, ["on=true"]) == {"on": True}
    assert recipe.parse_options(flag, ["on=0"]) == {"on": False}
    with pytest.raises(UsageError, match="expected true or false"):
        recipe.parse_options(flag, ["on=yes please"])


@pytest.mark.parametrize("name, option, message", [
    ("text_transformer", "dropout=nan", "--option=dropout=nan: must be in [0, 1)"),
    ("text_transformer", "dropout=1.5", "--option=dropout=1.5: must be in [0, 1)"),
    ("cifar10_resnet", "l2=-inf", "--option=l2=-inf: must be >= 0"),
    ("wide_and_deep", "table_rows=0", "--option=table_rows=0: must be >= 26"),
])
def test_numeric_options_are_checked_against_their_range(name, option, message):
    with pytest.raises(UsageError) as error:
        recipe.make_config(name, [option])
    assert str(error.value) == message


def test_numeric_options_without_a_range_must_still_be_finite():
    own = recipe.Recipe("own", None, None, None, options={"scale": recipe.Option(1.0, "a scale")})
    with pytest.raises(UsageError, match=r"^--option=scale=nan: must be a finite number$"):
        recipe.parse_options(own, ["scale=nan"])


def test_every_shipped_numeric_option_declares_its_range():
    unranged = [f"{name}.{key}" for name in recipe.available()
                for key, option in recipe.get(name).options.items()
                if type(option.default) in (int, float) and option.allowed is None]
    assert not unranged


RECIPE_FILE = """
import keras
from hvdtrain import data
from hvdtrain.recipe import Recipe, Splits

def load_data(config):
    return {load_data}

RECIPE = Recipe(name="mine", build_model=lambda config: {build_model}, load_data=load_data,
                loss="mse", defaults={defaults})
"""


def _recipe_file(path, build_model="keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])",
                 load_data="Splits(train=data.from_arrays(([[0.0, 1.0]], [0.0]), 1))",
                 defaults="dict(epochs=2)"):
    path.write_text(RECIPE_FILE.format(build_model=build_model, load_data=load_data,
                                       defaults=defaults))
    return str(path)


def test_a_bad_default_is_the_recipes_not_a_flag_never_given(tmp_path):
    name = _recipe_file(tmp_path / "mine.py", defaults="dict(learning_rate=-0.05)")
    with pytest.raises(UsageError) as error:
        recipe.make_config(name)
    assert str(error.value) == ("recipe mine has a bad default (--learning_rate must be positive, "
                                "got -0.05); fix its Recipe(defaults=...), or set that flag")
    # A flag given instead of the default: that default does not apply.
    assert recipe.make_config(name, learning_rate=0.1).learning_rate == 0.1


def test_settings_that_do_not_go_together_are_refused_with_the_recipes_defaults(tmp_path):
    name = _recipe_file(tmp_path / "mine.py", defaults="dict(optimizer='adam')")
    with pytest.raises(UsageError, match="--nesterov applies to --optimizer=sgd, not adam"):
        recipe.make_config(name, nesterov=True)


@pytest.mark.parametrize("returned, message", [
    (dict(build_model="None"), "recipe mine: build_model returned None, not a keras.Model; "
                               "return the model it builds"),
    (dict(build_model="[keras.layers.Dense(1)]"), "recipe mine: build_model returned a list, "
                                                  "not a keras.Model"),
    (dict(load_data="(1, 2)"), "recipe mine: load_data returned a tuple, not "
                               "hvdtrain.recipe.Splits(train=..., validation=...) of hvdtrain.data "
                               "datasets"),
    (dict(load_data="Splits(train=[1, 2])"), "recipe mine: load_data's train split is a list, "
                                             "not a ShardedDataset"),
])
def test_a_recipe_returning_the_wrong_thing_is_named_with_what_was_expected(
        tmp_path, returned, message):
    hvdtrain.init()
    name = _recipe_file(tmp_path / "mine.py", **returned)
    config = recipe.make_config(name)
    mine = recipe.get(name)
    with pytest.raises(UsageError) as error:
        mine.make_model(config)
        mine.make_splits(config)
    assert str(error.value).startswith(message)


def test_a_recipe_file_is_the_same_recipe_however_its_path_is_spelled_or_after_it_moved(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    written = recipe.make_config(_recipe_file(tmp_path / "mine.py")).recorded()
    assert written["recipe"] == str(tmp_path / "mine.py")
    assert recipe.make_config("./mine.py").same_recipe(written)
    (tmp_path / "moved").mkdir()
    (tmp_path / "mine.py").rename(tmp_path / "moved" / "mine.py")
    assert recipe.make_config("moved/mine.py").same_recipe(written)
    # Another recipe file, or one of a recipe's name, is another recipe.
    other = recipe.make_config(_recipe_file(tmp_path / "other.py", defaults="dict(epochs=3)"))
    assert not other.same_recipe(written)
    assert not recipe.make_config("digits_cnn").same_recipe(written)
