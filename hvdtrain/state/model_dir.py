"""Where a run writes: checked before anything expensive starts."""

import os
import pathlib
import tempfile

from hvdtrain.errors import UsageError

__all__ = ["DEFAULT_PARENT", "check_usable"]

DEFAULT_PARENT = pathlib.Path("runs")   # a recipe's default --model_dir is runs/<recipe>


def check_usable(path):
    """Raises UsageError unless `path` is a directory this process can write
    in, or one it can create. Leaves nothing behind: the trial directory is
    made where the first existing ancestor is, and removed."""
    path = pathlib.Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is under {existing}, a file"
        raise UsageError(f"--model_dir={path} {where}, not a directory; "
                         "choose another --model_dir")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hvdtrain-check-", dir=existing))
    except OSError as e:
        raise UsageError(f"--model_dir={path} cannot be written ({existing}: {e.strerror}); "
                         "choose a directory you can write to") from None
