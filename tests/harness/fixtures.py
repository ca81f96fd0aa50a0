"""What a folder of ranked tests imports into its conftest.py: the launch
each test runs in, and the fixtures a test on every rank needs."""

import os
import pathlib
import re

import keras
import pytest
from absl import logging

from harness import launches

__all__ = ["controller", "keras_state_reset", "layout_reset", "process_state_restored",
           "pytest_generate_tests", "ranked_launch", "shared_tmp_path"]

# rank_main.py tells the tests where the launch keeps its files, and the
# dispatcher where its session keeps what every launch may share.
WORKDIR = "HVDTRAIN_RANKED_WORKDIR"
SESSION_DIR = "HVDTRAIN_RANKED_SESSION"


def pytest_generate_tests(metafunc):
    metafunc.parametrize("ranked_launch", launches.of_function(metafunc.definition), ids=str,
                         indirect=True)


@pytest.fixture(autouse=True)
def ranked_launch(request):
    """The `harness.launches.Launch` this test runs in."""
    return request.param


@pytest.fixture
def controller(ranked_launch):
    """Horovod's controller of this launch: "gloo" or "mpi"."""
    return ranked_launch.controller


@pytest.fixture
def shared_tmp_path(request):
    """A directory for this test that every rank sees at the same path
    (tmp_path is each rank's own)."""
    name = re.sub(r"[^\w.-]+", "_", request.node.nodeid)[-120:]
    path = pathlib.Path(os.environ[WORKDIR]) / "shared" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(autouse=True)
def process_state_restored():
    """Each test starts from the launch's environment variables and log
    verbosity (hvdtrain.init, for one, sets Horovod's variables for a Horovod
    not yet started, and the verbosity its --verbose_all_ranks asks for)."""
    environment, verbosity = dict(os.environ), logging.get_verbosity()
    yield
    for name in set(os.environ) - set(environment):
        del os.environ[name]
    os.environ.update(environment)
    logging.set_verbosity(verbosity)


@pytest.fixture(autouse=True)
def keras_state_reset():
    """Each test starts from Keras's defaults: generated layer names from
    their first number (on every rank alike), float32."""
    keras.utils.clear_session()
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.clear_session()


@pytest.fixture(autouse=True)
def layout_reset():
    """Each test ends with every worker its own replica again (a test or the
    hvdtrain command it ran may have arranged tensor-parallel groups)."""
    yield
    from hvdtrain import layout

    layout.arrange(1)
