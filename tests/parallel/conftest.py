import pytest

from parallel.interrupted_runs import Uninterrupted


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, pytestconfig):
    """uninterrupted(controller): the model directory of DIGITS trained to the
    end (parallel/interrupted_runs.py), made once per controller."""
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's base is a folder of its session's, which the workers share.
    return Uninterrupted(base.parent if hasattr(pytestconfig, "workerinput") else base)
