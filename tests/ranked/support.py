"""What ranked tests share: every rank's value of something, what the
session computes once (e.g. a single-process reference), and the `hvdtrain`
command run in this rank's process."""

import dataclasses
import os
import pathlib

import horovod.tensorflow as hvd
import tensorflow as tf

from harness.fixtures import SESSION_DIR

__all__ = ["Finished", "computed_once", "gathered", "hvdtrain_command"]


def gathered(value):
    """[value on rank 0, value on rank 1, ...] (any picklable value), on every rank."""
    return hvd.allgather_object(value)


def computed_once(name, compute):
    """A directory that `compute(directory)` filled, once in the session:
    rank 0 of the first launch that asks computes it, every rank of every
    launch reads it (e.g. what one process alone computes, for a reference)."""
    directory = pathlib.Path(os.environ[SESSION_DIR]) / name
    done = directory / ".complete"
    failure = None
    if hvd.rank() == 0 and not done.exists():
        directory.mkdir(parents=True, exist_ok=True)
        try:
            compute(directory)
            done.touch()
        except BaseException as e:   # the others hear of it after the barrier
            failure = e
    hvd.allreduce(tf.constant(0), name=f"computed_once.{name}")
    if failure is not None:
        raise failure
    assert done.exists(), f"rank 0 could not compute {name} (see its report)"
    return directory


@dataclasses.dataclass(frozen=True)
class Finished:
    """How an in-process `hvdtrain` command ended on this rank."""
    status: int
    stdout: str
    stderr: str

    @property
    def output(self):
        return self.stdout + self.stderr


def hvdtrain_command(capfd, *args):
    """Runs `hvdtrain ARGS` in this process, as `horovodrun ... hvdtrain ARGS`
    runs it on this rank: flags parsed afresh, its exit caught, its output
    (of Python and of TensorFlow's and Horovod's C++) captured."""
    from absl import flags

    from hvdtrain import cli

    capfd.readouterr()
    flags.FLAGS.unparse_flags()
    try:
        cli.run(["hvdtrain", *map(str, args)])
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    out, err = capfd.readouterr()
    return Finished(status, out, err)
