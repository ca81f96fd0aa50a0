"""Ends a process whose training makes no progress, so that a job never
hangs: a rank waiting in a collective for a peer that stopped responding
(a hung input pipeline, a deadlock, a lost host the launcher cannot see)
exits non-zero, and the launcher then stops the others.

Horovod's own stall check does this too, naming the missing rank, but in
0.28.1 only with the MPI controller; the watchdog, with any controller, gives
it time to act first."""

import os
import sys
import threading
import time

import horovod.tensorflow as hvd
import keras


class StallWatchdog(keras.callbacks.Callback):
    """Exits the process with status 1 when no training or evaluation batch
    or epoch has finished for `timeout` seconds."""

    def __init__(self, timeout):
        super().__init__()
        self.timeout = timeout
        self._last = time.monotonic()
        self._stop = threading.Event()

    def on_train_begin(self, logs=None):
        self._progress()
        self._stop.clear()
        threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True).start()

    def on_train_end(self, logs=None):
        self._stop.set()

    def _progress(self, *args, **kwargs):
        self._last = time.monotonic()

    on_epoch_begin = on_epoch_end = on_train_batch_end = on_test_batch_end = _progress

    def _watch(self):
        while not self._stop.wait(min(self.timeout / 4, 5.0)):
            if time.monotonic() - self._last > self.timeout:
                sys.stderr.write(
                    f"hvdtrain: error: rank {hvd.rank()} made no progress for {self.timeout:g} s "
                    "(a worker stopped responding, or this one's input hangs); stopping the job. "
                    "If steps can take that long, raise --stall_timeout\n")
                sys.stderr.flush()
                os._exit(1)
