import pytest


@pytest.fixture(params=["gloo", "mpi"])
def controller(request):
    """Each parallel test that takes this runs under both of Horovod's CPU controllers."""
    return request.param
