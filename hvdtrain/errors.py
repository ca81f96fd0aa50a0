"""Errors that end a run with one clear line instead of a traceback."""


class UsageError(Exception):
    """Bad input (flags, config, data): the message names the problem and the
    fix, and the command line prints just that one line."""


def horovod_shut_down(error):
    """True for the error a collective raises on a rank after another rank
    failed and Horovod shut down."""
    return "Horovod has been shut down" in str(error)
