"""`hvdtrain train` with the awkward moments for a signal made long enough
to aim at: SLOW=save (each checkpoint save), validation (each validation
pass) or epoch_end (the epoch-end callbacks), each made SLOW_SECONDS
longer. Entering one, the process creates SLOW_DIR/<SLOW>-<rank>-<n> (n
counts from 1), so a test can signal while it lasts. Arguments: the
`hvdtrain train` flags."""

import functools
import os
import pathlib
import sys
import time

import horovod.tensorflow as hvd

from hvdtrain import cli
from hvdtrain.callbacks import exact_evaluation, run_log_writer
from hvdtrain.state import checkpoint

moment, seconds = os.environ["SLOW"], float(os.environ["SLOW_SECONDS"])
entered = 0


def slowed(function):
    @functools.wraps(function)
    def slow(*args, **kwargs):
        global entered
        entered += 1
        (pathlib.Path(os.environ["SLOW_DIR"]) / f"{moment}-{hvd.rank()}-{entered}").touch()
        time.sleep(seconds)
        return function(*args, **kwargs)
    return slow


if moment == "save":
    checkpoint.save = slowed(checkpoint.save)
elif moment == "validation":
    exact_evaluation.ExactEvaluation.on_test_begin = slowed(
        exact_evaluation.ExactEvaluation.on_test_begin)
else:
    run_log_writer.RunLog.on_epoch_end = slowed(run_log_writer.RunLog.on_epoch_end)
cli.run([sys.argv[0], "train", *sys.argv[1:]])
