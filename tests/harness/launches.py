"""Which launches a ranked test runs in, and its timeout: the same answer
in the dispatcher and on the ranks."""

import dataclasses

import pytest

CONTROLLERS = ("gloo", "mpi")
# Seconds a ranked test may take on every rank, setup and teardown
# included, unless it says otherwise with @pytest.mark.timeout(SECONDS).
DEFAULT_TIMEOUT = 300.0


@dataclasses.dataclass(frozen=True, order=True)
class Launch:
    """One `horovodrun -np <np> --<controller>` that ranked tests share."""
    np: int
    controller: str

    def __str__(self):
        return self.controller if self.np == 2 else f"{self.controller}-np{self.np}"


def _parsed(marker, nodeid):
    kwargs = dict(marker.kwargs) if marker else {}
    unknown = set(kwargs) - {"np", "controllers"}
    if unknown or (marker and marker.args):
        raise pytest.UsageError(f"{nodeid}: @pytest.mark.launches takes np= and controllers= "
                                f"only, not {sorted(unknown) or marker.args}")
    np = kwargs.get("np", 2)
    controllers = kwargs.get("controllers", CONTROLLERS if np == 2 else ("gloo",))
    if not set(controllers) <= set(CONTROLLERS) or np < 2:
        raise pytest.UsageError(f"{nodeid}: launches(np={np}, controllers={controllers}) needs "
                                f"np >= 2 and controllers of {CONTROLLERS}")
    return [Launch(np, c) for c in controllers]


def of_function(definition):
    """The launches a ranked test function runs in: `@pytest.mark.launches(np=N,
    controllers=(...))` on it or its module; by default np=2 under both
    controllers, and a larger np under Gloo only (one launch per size). The
    mark on one parameter set (`pytest.param(..., marks=...)`) narrows its
    function's launches for that set (see wanted)."""
    return _parsed(definition.get_closest_marker("launches"), definition.nodeid)


def wanted(item):
    """Whether a ranked test case runs in the launch it was generated for:
    its parameter set's own launches mark may leave that launch out."""
    return of_item(item) in _parsed(item.get_closest_marker("launches"), item.nodeid)


def of_item(item):
    """The launch a collected test case belongs to; None: not a ranked test."""
    callspec = getattr(item, "callspec", None)
    launch = callspec.params.get("ranked_launch") if callspec else None
    return launch if isinstance(launch, Launch) else None


def timeout(item):
    """Seconds the test may take (see DEFAULT_TIMEOUT)."""
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker and marker.args else DEFAULT_TIMEOUT
