"""What a recipe provides (model, data, loss, metrics, default settings) and
how recipes are found by name.

Recipes live in the repository's `recipes/` folder, installed as the package
`hvdtrain.recipes`: `--recipe=NAME` imports `hvdtrain.recipes.NAME`, whose
module attribute `RECIPE` is a `Recipe`. `--recipe=path/to/file.py` loads a
recipe of the user's own from that file.
"""

import dataclasses
import importlib
import importlib.util
import math
import pathlib
import pkgutil
from collections.abc import Callable
from typing import Any

from hvdtrain.config import Range, TrainConfig
from hvdtrain.errors import UsageError

__all__ = ["Option", "Recipe", "Splits", "available", "check_name", "describe_options", "get",
           "make_config", "parse_options"]


@dataclasses.dataclass(frozen=True)
class Splits:
    """This worker's training and validation data, as a recipe's `load_data` returns it.

    Args:
        train: The training data, a `hvdtrain.data.ShardedDataset` of this
            worker's shard.
        validation: The validation data, likewise; None: no validation
            after each epoch (benchmarks).
    """
    train: Any
    validation: Any = None


@dataclasses.dataclass(frozen=True)
class Option:
    """A setting of one recipe's own (an image size, a vocabulary), set with
    --option=NAME=VALUE.

    Args:
        default: The value without the option; its type is the option's.
        help: One line for --help.
        allowed: For a number, the `hvdtrain.config.Range` its values must
            be in; None: any finite number.
        choices: For a string, the values it may take; None: any.
    """
    default: bool | int | float | str
    help: str
    allowed: Range | None = None
    choices: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What `hvdtrain.train` needs to train one kind of model.

    Args:
        name: The recipe's name, as `--recipe` gives it.
        build_model: `(config) -> keras.Model`, uncompiled: the trainer
            compiles it with its distributed optimizer.
        load_data: `(config) -> Splits`, called after `hvdtrain.init()`, so
            that it can shard by rank.
        loss: The loss, as `keras.Model.compile` takes it.
        metrics: Metric names, or keras Metric classes (made at compile
            time, after `hvdtrain.init()`).
        defaults: `TrainConfig` values of this recipe, under the command
            line's flags.
        options: `{name: Option}`, the recipe's own settings; their values
            are in `config.options`.
        unit: What throughput counts: examples, images, sequences...
        evaluation_splits: {name: (config) -> ShardedDataset} of the splits
            `hvdtrain evaluate --split=NAME` reads besides "validation"
            (`load_data`'s), each in evaluation order: every example once,
            not augmented.
        check: `(config) -> None`, the recipe's own check of the settings
            (its options' formats and how they go together, settings its
            model cannot follow), raising `UsageError`: `make_config` runs
            it, so a bad one is refused before any work, by `--dry_run` too.
        tokens_per_example: `(config) -> int` for a language model: the
            tokens an example trains on, for the throughput in tokens/s and
            the model FLOPs utilisation the trainer logs.
    """
    name: str
    build_model: Callable[..., Any]
    load_data: Callable[..., Splits]
    loss: Any
    metrics: tuple = ()
    defaults: dict = dataclasses.field(default_factory=dict)
    options: dict = dataclasses.field(default_factory=dict)
    unit: str = "examples"
    evaluation_splits: dict = dataclasses.field(default_factory=dict)
    check: Callable[..., None] | None = None
    tokens_per_example: Callable[..., int] | None = None

    def make_model(self, config):
        """`build_model(config)`, checked to be a Keras model.

        Raises:
            UsageError: Naming what `build_model` returned instead.
        """
        import keras

        model = self.build_model(config)
        if not isinstance(model, keras.Model):
            raise UsageError(f"recipe {self.name}: build_model returned {_kind(model)}, not a "
                             "keras.Model; return the model it builds")
        return model

    def make_splits(self, config):
        """`load_data(config)`, checked to be `Splits` of sharded datasets.

        Raises:
            UsageError: Naming what `load_data` returned instead.
        """
        from hvdtrain.data import ShardedDataset

        splits = self.load_data(config)
        expected = ("hvdtrain.recipe.Splits(train=..., validation=...) of "
                    "hvdtrain.data datasets (from_arrays, from_tfrecords, ...)")
        if not isinstance(splits, Splits):
            raise UsageError(f"recipe {self.name}: load_data returned {_kind(splits)}, not "
                             f"{expected}")
        for name, split in (("train", splits.train), ("validation", splits.validation)):
            if not isinstance(split, ShardedDataset) and not (name == "validation"
                                                              and split is None):
                raise UsageError(f"recipe {self.name}: load_data's {name} split is "
                                 f"{_kind(split)}, not a ShardedDataset; return {expected}")
        return splits


def available():
    """The names of the recipes in `hvdtrain.recipes`, sorted."""
    # Found by name, as they are loaded: recipes use this module, not the reverse.
    folders = importlib.util.find_spec("hvdtrain.recipes").submodule_search_locations
    return sorted(m.name for m in pkgutil.iter_modules(folders))


def check_name(name):
    """Checks that `name` is a recipe's name or the path of a recipe file.

    Raises:
        UsageError: Otherwise, listing the recipes there are.
    """
    if name.endswith(".py"):
        if not pathlib.Path(name).is_file():
            raise UsageError(f"recipe file {name} does not exist; check the path")
    elif name not in available():
        raise UsageError(f"unknown recipe '{name}'; choose one of: {', '.join(available())}, "
                         "or give the path of a recipe file")


def get(name):
    """The recipe called `name`, or defined in the file `name`.

    Args:
        name: A recipe's name (`available()`), or the path of a `.py` file
            that defines `RECIPE = hvdtrain.recipe.Recipe(...)`.

    Returns:
        The `Recipe`.

    Raises:
        UsageError: If there is no such recipe, or the file defines none.
    """
    check_name(name)
    if not name.endswith(".py"):
        return importlib.import_module(f"hvdtrain.recipes.{name}").RECIPE
    spec = importlib.util.spec_from_file_location(pathlib.Path(name).stem, name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "RECIPE", None), Recipe):
        raise UsageError(f"{name} defines no RECIPE = hvdtrain.recipe.Recipe(...)")
    return module.RECIPE


def make_config(name, options=(), **overrides):
    """The settings of a run of recipe `name`.

    Args:
        name: As for `get`.
        options: The recipe's own settings, as "NAME=VALUE" strings or a
            dict; the others keep their defaults.
        **overrides: `TrainConfig` fields, over the recipe's defaults; None
            keeps the default.

    Returns:
        A `TrainConfig`.

    Raises:
        UsageError: If there is no such recipe, an option is unknown or has
            a bad value, a default of the recipe's that applies is bad (named
            as the recipe's), or the settings do not go together.
    """
    recipe = get(name)
    values = {key: option.default for key, option in recipe.options.items()}
    values.update(parse_options(recipe, options))
    # The recipe's defaults that apply, checked as such: a bad one is the
    # recipe's to fix, not a flag the user never gave.
    applied = {key: value for key, value in recipe.defaults.items()
               if overrides.get(key) is None}
    try:
        defaults = TrainConfig(recipe=_spelled(name), options=values).override(**applied)
        defaults.validate()
    except UsageError as e:
        raise UsageError(f"recipe {recipe.name} has a bad default ({e}); fix its "
                         "Recipe(defaults=...), or set that flag") from None
    config = defaults.override(**overrides).validate()
    if recipe.check is not None:
        recipe.check(config)
    return config


def parse_options(recipe, options):
    """{name: typed value} from "NAME=VALUE" strings (or a dict) for
    `recipe`; a UsageError names an unknown option or a bad value."""
    pairs = options.items() if isinstance(options, dict) else [
        _split_option(text) for text in options]
    parsed = {}
    for key, value in pairs:
        if key not in recipe.options:
            known = ", ".join(recipe.options) or "none"
            raise UsageError(f"recipe {recipe.name} has no option '{key}'; its options: {known}")
        option = recipe.options[key]
        parsed[key] = _typed(key, value, type(option.default))
        if isinstance(parsed[key], (int, float)) and not isinstance(parsed[key], bool):
            allowed = option.allowed or Range(-math.inf)
            if parsed[key] not in allowed:
                expected = allowed.describe() if option.allowed else "a finite number"
                raise UsageError(f"--option={key}={value}: must be {expected}")
        if option.choices and parsed[key] not in option.choices:
            raise UsageError(f"--option={key}={value}: choose one of {', '.join(option.choices)}")
    return parsed


def describe_options(recipe):
    """The recipe's options for --help: one line each."""
    return "\n".join(f"  --option={key}={option.default}: {option.help}"
                     for key, option in recipe.options.items())


def _spelled(name):
    """`name` as settings keep it: a recipe's name as is, a recipe file's
    path absolute and resolved (one file, one spelling)."""
    return str(pathlib.Path(name).resolve()) if name.endswith(".py") else name


def _kind(value):
    return "None" if value is None else f"a {type(value).__name__}"


def _split_option(text):
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise UsageError(f"--option={text} is not NAME=VALUE; e.g. --option=image_size=224")
    return key.strip(), value.strip()


def _typed(key, value, kind):
    if not isinstance(value, str):
        value = str(value)
    try:
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return value.lower() in ("true", "1")
        return kind(value)
    except ValueError:
        expected = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, "text")
        raise UsageError(f"--option={key}={value}: expected {expected}") from None
