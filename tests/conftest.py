import pytest

from harness.dispatch import Dispatcher
from harness.rank_plugin import RankPlugin


def pytest_configure(config):
    # On a rank of a ranked launch the rank's own plugin is there instead.
    if not any(isinstance(p, RankPlugin) for p in config.pluginmanager.get_plugins()):
        config.pluginmanager.register(Dispatcher(), "ranked-dispatcher")


@pytest.fixture(params=["gloo", "mpi"])
def controller(request):
    """Each parallel test that takes this runs under both of Horovod's CPU controllers."""
    return request.param
