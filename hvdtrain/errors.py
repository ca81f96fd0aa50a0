"""Errors that end a run with one clear line instead of a traceback."""

__all__ = ["MODEL_INPUT", "TrainingError", "UsageError", "lost_peer"]

# Starts the message of a check a model's layer makes of its inputs inside
# the train step (an id outside an embedding table); such a check fails on
# every worker in the same step.
MODEL_INPUT = "bad model input: "


class UsageError(Exception):
    """Bad input (flags, config, data): the message names the problem and the
    fix, and the command line prints just that one line."""


class TrainingError(Exception):
    """A run that cannot go on (a non-finite loss, a checkpoint that cannot be
    written): the command line prints the message as one line, exit 1."""


# What a collective raises on a rank whose peer failed: Horovod's shut-down
# (a peer's exception, or its stall check giving up on a peer) and Gloo's
# transport errors (a peer's process died, or stopped responding).
_LOST_PEER = ("Horovod has been shut down", "Timed out waiting", "Connection closed by peer",
              "Connection reset by peer", "Broken pipe")


def lost_peer(error):
    """For the error a collective raises after another rank failed, why in
    one line; None for any other error."""
    text = str(error)
    for sign in _LOST_PEER:
        if sign in text:
            line = next(line for line in text.splitlines() if sign in line)
            # Gloo's lines start with the source file in brackets.
            return line.rsplit("] ", 1)[-1].strip() if "] " in line else sign
    return None
