"""Where a run writes: checked before anything expensive starts."""

import os
import pathlib
import tempfile

from hvdtrain.errors import UsageError

__all__ = ["DEFAULT_PARENT", "check_usable", "check_writable_file"]

DEFAULT_PARENT = pathlib.Path("runs")   # a recipe's default --model_dir is runs/<recipe>


def check_usable(path):
    """Raises UsageError unless `path` is a directory this process can write
    in, or one it can create. Leaves nothing behind: the trial directory is
    made where the first existing ancestor is, and removed."""
    _check_directory(pathlib.Path(path), "--model_dir", pathlib.Path(path))


def check_writable_file(path, flag):
    """Raises UsageError unless a file can be written at `path` (`flag` names
    where it came from), its directory made if needed, as check_usable."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise UsageError(f"{flag}={path} is a directory; name a file to write, such as "
                         f"{path / 'evaluation.json'}")
    _check_directory(path.parent, flag, path)


def _check_directory(directory, flag, given):
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == given else f"is under {existing}, a file"
        raise UsageError(f"{flag}={given} {where}, not a directory; choose another {flag}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hvdtrain-check-", dir=existing))
    except OSError as e:
        what = "a directory" if given == directory else "a place"
        raise UsageError(f"{flag}={given} cannot be written ({existing}: {e.strerror}); "
                         f"choose {what} you can write to") from None
