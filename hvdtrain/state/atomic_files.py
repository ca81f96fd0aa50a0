"""Files and directories that appear complete or not at all: written under a
hidden temporary name beside their place, synced, then renamed into it. What
a write cut short leaves behind keeps the temporary name, for
`remove_unfinished`."""

import os
import pathlib
import shutil

__all__ = ["fsync_directory", "remove_unfinished", "save_model", "temporary_path",
           "write_synced", "write_whole"]

_TEMPORARY = ".tmp-"


def temporary_path(path):
    """Where to write `path` before renaming it into place: hidden, marked as
    unfinished, and ending with the name (Keras checks suffixes)."""
    path = pathlib.Path(path)
    return path.with_name(f"{_TEMPORARY}{os.getpid()}.{path.name}")


def remove_unfinished(directory):
    """Deletes what writes cut short left behind in `directory`."""
    directory = pathlib.Path(directory)
    if directory.is_dir():
        for path in directory.glob(f"{_TEMPORARY}*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def save_model(model, path, weights_only=False):
    """Saves `model` at `path` (`.keras`, or `.weights.h5` with
    `weights_only`), atomically."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        if weights_only:
            model.save_weights(tmp)
        else:
            model.save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_synced(path, text):
    """Writes `text` to `path` and waits until it is on disk."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_whole(path, text):
    """Writes `text` to `path`, atomically (creating its directory)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write_synced(tmp, text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def fsync_directory(path):
    """Waits until the entries of directory `path` (files created or renamed
    there) are on disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
