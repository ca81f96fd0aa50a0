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
import pathlib
import pkgutil
from typing import Any, Callable

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Splits:
    """This worker's training and validation data (hvdtrain.data.ShardedDataset)."""
    train: Any
    validation: Any


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    build_model: Callable[..., Any]       # (config) -> keras.Model, uncompiled
    load_data: Callable[..., Splits]      # (config) -> Splits, after hvdtrain.init()
    loss: Any
    metrics: tuple = ()
    defaults: dict = dataclasses.field(default_factory=dict)  # TrainConfig values


def available():
    from hvdtrain import recipes
    return sorted(m.name for m in pkgutil.iter_modules(recipes.__path__))


def check_name(name):
    """Raises a UsageError listing the recipes there are unless `name` is one
    (or the path of a recipe file)."""
    if name.endswith(".py"):
        if not pathlib.Path(name).is_file():
            raise UsageError(f"recipe file {name} does not exist; check the path")
    elif name not in available():
        raise UsageError(f"unknown recipe '{name}'; choose one of: {', '.join(available())}, "
                         "or give the path of a recipe file")


def get(name):
    """The recipe called `name`, or defined in the file `name`."""
    check_name(name)
    if not name.endswith(".py"):
        return importlib.import_module(f"hvdtrain.recipes.{name}").RECIPE
    spec = importlib.util.spec_from_file_location(pathlib.Path(name).stem, name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "RECIPE", None), Recipe):
        raise UsageError(f"{name} defines no RECIPE = hvdtrain.recipe.Recipe(...)")
    return module.RECIPE


def make_config(name, **overrides):
    """The recipe's default settings with `overrides` (None: keep the default)."""
    recipe = get(name)
    return TrainConfig(recipe=name).override(**recipe.defaults).override(**overrides)
