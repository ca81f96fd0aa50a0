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
    labels = [sorted(int(ex["label"]) for ex in b.as_dataset("validation")) for b in (builder, again)]
    assert labels[0] == labels[1] and set(labels[0]) == set(range(10))


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
