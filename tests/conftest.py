import os

import pytest

from harness.dispatch import Dispatcher
from harness.rank_plugin import RankPlugin


def pytest_addoption(parser):
    parser.addoption("--ranked-np", type=int, default=None, metavar="N",
                     help="run only the ranked tests of launches with N processes")


def pytest_configure(config):
    # Every Horovod process the tests start coordinates every 5 ms instead of
    # every 1: on 2 cores, two ranks' exchanges each millisecond take CPU the
    # tests need (a sixth of the ranked tests' time), and the cycle changes
    # when tensors are reduced, never what they add up to.
    os.environ.setdefault("HOROVOD_CYCLE_TIME", "5")
    # A rank of an MPI job that waits for another (in its input, stopped,
    # hung: what many tests arrange) spins a core in Open MPI's progress loop:
    # yielding it, the spin gives way to the tests' other processes.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # On a rank of a ranked launch the rank's own plugin is there instead.
    if not any(isinstance(p, RankPlugin) for p in config.pluginmanager.get_plugins()):
        config.pluginmanager.register(Dispatcher(), "ranked-dispatcher")
        if config.pluginmanager.hasplugin("xdist"):
            from harness.scheduling import Scheduling

            config.pluginmanager.register(Scheduling(), "suite-scheduling")


@pytest.fixture(params=["gloo", "mpi"])
def controller(request):
    """Each parallel test that takes this runs under both of Horovod's CPU controllers."""
    return request.param
