"""The ranks' meeting point after each phase of a ranked test: files in a
directory they share (the launch runs on one host).

It is deliberately not a Horovod collective: a rank whose test failed
before a collective leaves the others blocked inside that collective, and a
collective of the harness would then pair with theirs. Files also tell
the watchdog which ranks have arrived while one has not."""

import json
import os
import pathlib
import time

__all__ = ["Rendezvous"]


class Rendezvous:
    def __init__(self, directory, rank, size):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rank, self.size = rank, size
        self.waiting_at = None   # the key this rank waits at, for the watchdog

    def _path(self, key, rank):
        return self.directory / f"{key}.rank{rank}.json"

    def exchange(self, key, payload):
        """Leaves `payload` (JSON) at `key`, waits for every rank's; returns
        them in rank order. Waits for ever: the watchdog ends a wait that
        lasts past the test's timeout."""
        temporary = self._path(key, self.rank).with_suffix(".partial")
        temporary.write_text(json.dumps(payload))
        os.replace(temporary, self._path(key, self.rank))
        self.waiting_at = key
        pause = 0.001
        while self.missing(key):
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        self.waiting_at = None
        return [json.loads(self._path(key, r).read_text()) for r in range(self.size)]

    def missing(self, key):
        """The ranks that have not arrived at `key`."""
        return [r for r in range(self.size) if not self._path(key, r).exists()]
