"""Output that its reader stopped reading.

A worker's stdout and stderr are pipes to its launcher (horovodrun --gloo
reads them to put each rank's name before its lines). When the launcher dies,
the next write raises BrokenPipeError wherever it happens (Keras's progress
bar, a log line, a stop's own message) and ends the worker before the
checkpoint its launcher watch would have it write. After `install()`, a
write that finds its pipe closed sends that stream to /dev/null instead, for
Python's writes and TensorFlow's alike, and training goes on to its stop.
"""

import os
import sys

__all__ = ["install", "say"]


class _Unbroken:
    """`stream`, whose writes and flushes never raise BrokenPipeError."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self):
        _discard(self._stream.fileno())
        self._stream.flush()   # what the closed pipe refused, now to /dev/null

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install():
    """Guards sys.stdout and sys.stderr (once per process)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Unbroken):
            setattr(sys, name, _Unbroken(stream))


def say(text):
    """Writes `text` to stderr unbuffered, as a signal handler must (the main
    thread may be inside a buffered write); a closed pipe swallows it."""
    try:
        os.write(2, text.encode())
    except BrokenPipeError:
        _discard(2)


def _discard(fd):
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
