"""A key-value store every rank of a job reaches, outside Horovod: what the
ranks say of themselves while their collectives cannot carry it (the
watchdog's heartbeats, a failing rank's last words: faults/departures.py).

horovodrun's Gloo rendezvous server is one (its address is in the workers'
environment, and it outlives every worker); under other launchers rank 0
serves one (Horovod's KVStoreServer), its address broadcast at init. Both
speak Horovod's KVStoreHandler protocol: PUT and GET /scope/key.
"""

import contextlib
import json
import os
import socket
import urllib.request

import horovod.tensorflow as hvd

__all__ = ["Board", "open_for_run"]

_REQUEST_SECONDS = 2
_served = None   # the store this process serves, until the next run's
_runs = 0        # runs this process has started


class Board:
    """The store at host:port; `served`: whether this process serves it
    (and takes it away when it exits)."""

    def __init__(self, host, port, served=False):
        self._url = f"http://{host}:{port}"
        self.served = served

    @classmethod
    def from_environment(cls):
        """horovodrun's Gloo rendezvous store, or None outside Gloo."""
        host = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        return cls(host, port) if host and port else None

    def put(self, scope, key, value):
        """Stores `value` (JSON) under scope/key; a store that is gone is no error."""
        request = urllib.request.Request(f"{self._url}/{scope}/{key}",
                                         data=json.dumps(value).encode(), method="PUT")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(request, timeout=_REQUEST_SECONDS).close()

    def read(self, scope, keys):
        """{key: value} of those of `keys` stored under `scope`."""
        found = {}
        for key in keys:
            try:
                with urllib.request.urlopen(f"{self._url}/{scope}/{key}",
                                            timeout=_REQUEST_SECONDS) as response:
                    found[key] = json.loads(response.read())
            except (OSError, ValueError):
                pass
        return found


def open_for_run(board):
    """(the run's board, its id), on every rank: `board` (horovodrun's, or
    None) or else one rank 0 serves, and an id of this run, so that what
    one run said is not read as another's (a launch may run several).
    With a launcher's board no collective is needed (and none may be: under
    elastic mode a worker that joins runs this alone): each rank numbers its
    own runs, and every rank of a launch runs the same. Else a collective:
    call it on every rank, once per run."""
    global _runs, _served
    _runs += 1
    if board is not None:
        return board, f"run{_runs}"
    if _served is not None:
        _served.shutdown_server()
        _served = None
    address = None
    if hvd.rank() == 0:
        from horovod.runner.http.http_server import KVStoreServer

        _served = KVStoreServer(verbose=0)
        address = (socket.gethostname(), _served.start_server(), os.urandom(6).hex())
    host, port, run = hvd.broadcast_object(address, root_rank=0, name="hvdtrain.board")
    return Board(host, port, served=_served is not None), run
