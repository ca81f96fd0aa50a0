import pytest

from parallel.interrupted_runs import Uninterrupted


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """uninterrupted(controller): the model directory of DIGITS trained to the
    end (parallel/interrupted_runs.py), made once per controller."""
    return Uninterrupted(tmp_path_factory)
