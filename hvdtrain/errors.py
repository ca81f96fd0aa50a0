"""Errors that end a run with one clear line instead of a traceback."""


class UsageError(Exception):
    """Bad input (flags, config, data): the message names the problem and the
    fix, and the command line prints just that one line."""
