"""Stopping a run when the cluster takes its machines back, with nothing lost.

Slurm, Kubernetes and spot instances stop a job with a signal and a grace
period. On the first signal of `--preemption_signals` this process asks to
stop (`requested`); the ranks then agree to stop after the same training
step (hvdtrain.callbacks.PreemptionStop, whose vote rides on the step's
gradient allreduce), rank 0 writes a checkpoint of exactly that position,
and every process exits with EXIT_STATUS. A second signal changes nothing:
the stop under way is the quickest way to a whole checkpoint (SIGKILL still
ends a process at once, and leaves the previous checkpoint intact).

A worker whose launcher is gone asks to stop the same way
(hvdtrain.faults.launcher_watch): `horovodrun --mpi` dies of any signal sent to it
without passing it on.

No TensorFlow here: the command line checks --preemption_signals, and
reports a Preempted run, without loading it.
"""

import signal

from hvdtrain.errors import UsageError
from hvdtrain.faults import broken_pipes

__all__ = ["DEFAULT_SIGNALS", "EXIT_STATUS", "Preempted", "handling", "ignore_further",
           "install", "parse_signals", "request", "requested", "uninstall"]

# "Preempted: start again with --resume". In 128-255, the range Kubeflow's
# ExitCode restart policy retries, and above 128 + any signal number, so a
# death by signal never reads as it; distinct from 1 (failure) and 2 (usage).
EXIT_STATUS = 200
DEFAULT_SIGNALS = "SIGTERM,SIGUSR1,SIGINT"
# Signals a process cannot catch.
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}

_reason = None      # what asked first: a signal's name, or "launcher pid N gone"
_previous = {}      # the handlers install() replaced, by signal
_stopped = False    # the run has stopped on request: the process is exiting


class Preempted(Exception):
    """Training stopped on request, after a checkpoint of where it stands;
    `hvdtrain train` exits with EXIT_STATUS.

    Attributes:
        reason: What asked this process to stop (a signal's name), or None
            when another rank was asked.
        position: The `hvdtrain.state.training_state.Position` the run goes on
            from when started again with --resume.
    """

    def __init__(self, reason, position):
        self.reason, self.position = reason, position
        asked = reason or "a signal to another worker"
        super().__init__(f"preempted ({asked}): training stands after {position.describe()}, "
                         "in the last checkpoint; start again with --resume to go on")


def parse_signals(text):
    """The signals named in `text` ("SIGTERM,SIGUSR1"; "" for none).

    Raises:
        UsageError: A name is not a signal, or names one no process can catch.
    """
    chosen = []
    for name in filter(None, (part.strip().upper() for part in text.split(","))):
        try:
            number = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        except KeyError:
            raise UsageError(f"--preemption_signals: unknown signal {name}; name signals such "
                             f"as {DEFAULT_SIGNALS}, or leave it empty for none") from None
        if number in _UNCATCHABLE:
            raise UsageError(f"--preemption_signals: {number.name} cannot be caught; name "
                             f"signals such as {DEFAULT_SIGNALS}")
        chosen.append(number)
    return tuple(dict.fromkeys(chosen))


def install(signals):
    """Makes each of `signals` ask this process to stop (see the module's
    docstring), until `uninstall`. A signal this process was started with
    ignored stays ignored, as Python leaves SIGINT then (a job started in
    the background, or under nohup)."""
    global _reason, _stopped
    _reason, _stopped = None, False
    for number in signals:
        if signal.getsignal(number) != signal.SIG_IGN:
            _previous.setdefault(number, signal.signal(number, _on_signal))


def uninstall():
    """Gives back the handlers `install` replaced (none are left after
    `ignore_further`: a run that stopped keeps its signals ignored)."""
    while _previous:
        number, handler = _previous.popitem()
        signal.signal(number, handler)


def ignore_further():
    """Ignores the signals `install` handled, from now to the process's exit:
    the run has stopped. (Python's finalization resets the signals it has
    handlers for to their default action, but keeps ignored ones ignored.)"""
    global _stopped
    _stopped = True
    while _previous:
        number, _ = _previous.popitem()
        signal.signal(number, signal.SIG_IGN)


def handling():
    """Whether a stop request ends this run cleanly (`install` is in effect),
    or has ended it (`ignore_further`: the process is exiting with its status)."""
    return bool(_previous) or _stopped


def request(reason):
    """Asks this process to stop; the first reason is kept. Safe to call
    from a signal handler or another thread."""
    global _reason
    if _reason is None:
        _reason = reason
        _say(f"{reason}: stopping after the step under way, then writing a checkpoint")
    else:
        _say(f"{reason}: already stopping ({_reason}); SIGKILL would stop at once, "
             "leaving the previous checkpoint")


def requested():
    """What asked this process to stop, or None."""
    return _reason


def _on_signal(number, frame):
    request(signal.Signals(number).name)


def _say(text):
    # Not print or logging: a signal handler may run while the main thread is
    # inside a buffered write or holds a logging lock. Launchers prefix the
    # line with the rank.
    broken_pipes.say(f"hvdtrain: {text}\n")
