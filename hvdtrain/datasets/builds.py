"""A TFDS dataset built in its directory once, whoever asks for it: jobs
that start together on one machine (or share a data directory) wait for the
first one's build instead of each building it, which TFDS's final rename
fails for all but one."""

import fcntl
import pathlib

__all__ = ["build_once"]


def build_once(make_builder, **download_and_prepare_kwargs):
    """`make_builder()`'s builder, its dataset downloaded and prepared first
    unless it is there; a process that finds another preparing it waits."""
    builder = make_builder()
    if builder.is_prepared():
        return builder
    root = pathlib.Path(builder.data_dir).parents[1]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{builder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        builder = make_builder()   # as the first process left it
        if not builder.is_prepared():
            builder.download_and_prepare(**download_and_prepare_kwargs)
    return builder
