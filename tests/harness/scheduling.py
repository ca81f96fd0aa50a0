"""How pytest-xdist's workers share the suite (`make test` runs one per
core): much of a launch-level test is waiting (for a grace period, a stall
window, a signal's stop), and a second worker fills those waits.

The work goes out in units, in collection order: all of tests/ranked is one,
so that one worker's dispatcher runs the ranked launches one after another
as without xdist (the dispatcher collects them first: the longest unit goes
out first); every other test module is one, so that its module fixtures (one
training run that many tests check) are made once. The one-process unit
tests come last, where their small units even out the workers' ends."""

import pytest
from xdist.scheduler import LoadScopeScheduling

__all__ = ["RANKED", "Scheduling"]

RANKED = "tests/ranked/"


class _SuiteScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None):
        super().__init__(config, log)
        # Units in collection order, not by their numbers of tests.
        self.config.option.loadscopereorder = False

    def _split_scope(self, nodeid):
        return RANKED if nodeid.startswith(RANKED) else nodeid.split("::", 1)[0]


class Scheduling:
    """The pytest plugin that gives xdist the suite's scheduling, whatever
    --dist says: a ranked launch runs all its group's remaining cases, so
    no other worker may be given any of them."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        return _SuiteScheduling(config, log)
