"""What ranked tests share: every rank's value of something, work done by
rank 0 alone while the others wait, and what the session computes once
(e.g. a single-process reference). (The `hvdtrain` command in a rank's own
process: launch.hvdtrain_command.)"""

import os
import pathlib
import re
import signal
import threading
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from harness.fixtures import SESSION_DIR
from hvdtrain import layout
from hvdtrain.faults.preemption import Preempted
from launch import Finished

__all__ = ["computed_once", "error_lines", "gathered", "merged", "on_rank_0",
           "refused_on_every_rank", "replica_rows", "stopped_in_the_second_epoch"]


def gathered(value):
    """[value on rank 0, value on rank 1, ...] (any picklable value), on every rank."""
    return hvd.allgather_object(value)


def error_lines(results):
    """{rank: the line it printed with "hvdtrain: error:"} of a command run
    on every rank (`gathered` results of launch.hvdtrain_command)."""
    return {rank: text for rank, result in enumerate(results)
            for text in result.output.splitlines() if "hvdtrain: error:" in text}


def refused_on_every_rank(results):
    """The one line with which every rank refused a command (`gathered`
    results of launch.hvdtrain_command): each failed, and printed the same
    error line."""
    output = "".join(r.output for r in results)
    assert all(r.status != 0 for r in results), output[-3000:]
    errors = error_lines(results)
    assert set(errors) == set(range(len(results))) and len(set(errors.values())) == 1, \
        output[-3000:]
    return errors[0]


def replica_rows(global_batch, steps):
    """The rows of `steps` global batches of `global_batch` (examples in
    order) that this rank's replica trains on, in order."""
    per_replica = global_batch // layout.data_size()
    first = layout.data_rank() * per_replica
    return np.concatenate([np.arange(step * global_batch + first,
                                     step * global_batch + first + per_replica)
                           for step in range(steps)])


def merged(result):
    """This rank's `result` of a command run on every rank, as horovodrun
    reports the command: every rank's output one after the other, and status
    0 if every rank's is 0 (else the first other one)."""
    results = gathered(result)
    return Finished(next((r.status for r in results if r.status), 0),
                    "".join(r.stdout for r in results), "".join(r.stderr for r in results))


def on_rank_0(call, *args, **kwargs):
    """What `call(*args, **kwargs)` returns, called by rank 0 alone (e.g. to
    write what every rank then reads), on every rank once it is done. Its
    error fails every rank: no rank goes on to a collective the others skip."""
    result = error = None
    if hvd.rank() == 0:
        try:
            result = call(*args, **kwargs)
        except Exception as e:   # raised here after the others heard of it
            error = e
    result, failure = gathered((result, None if error is None else repr(error)))[0]
    if error is not None:
        raise error
    if failure is not None:
        raise RuntimeError(f"rank 0's {getattr(call, '__name__', 'call')} failed: {failure}")
    return result


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



_STOPS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def stopped_in_the_second_epoch(config):
    """Trains `config` in this process (hvdtrain.train: the command's exit
    would end the launch) with SIGUSR1 sent to rank 1 once the first
    epoch's checkpoint exists; returns where each rank stopped ("epoch 2,
    step S"), which it checks it did."""
    from hvdtrain import train

    checkpoints = pathlib.Path(config.model_dir) / "checkpoints"
    handlers = {number: signal.getsignal(number) for number in _STOPS}
    if hvd.rank() == 1:
        def send():
            while not any(checkpoints.glob("epoch-0001-step-*")):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGUSR1)

        threading.Thread(target=send, daemon=True).start()
    try:
        train(config)
        stopped = None
    except Preempted as e:
        stopped = re.search(r"after (epoch 2, step \d+)", str(e)).group(1)
    finally:
        for number, handler in handlers.items():   # a stopped run leaves them ignored
            signal.signal(number, handler)
    assert stopped is not None, "training was not stopped"
    return gathered(stopped)
