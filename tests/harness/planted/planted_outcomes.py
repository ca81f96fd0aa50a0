"""Tests planted for the harness's own tests (tests/parallel/test_ranked_harness.py):
not part of the suite (their files do not match test_*.py)."""

import horovod.tensorflow as hvd
import pytest
import tensorflow as tf


def test_passes_on_every_rank():
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy() == hvd.size()


def test_fails_on_rank_1_only():
    hvd.allreduce(tf.constant(1.0), name="planted.before_the_assertion")
    assert hvd.rank() != 1, "planted failure on rank 1"


def test_after_the_failure_collectives_pair_up():
    # Had rank 0 gone on while rank 1 failed, their collectives would mix.
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


@pytest.mark.timeout(5)
def test_hangs_on_rank_0():
    if hvd.rank() == 0:
        hvd.allreduce(tf.constant(1.0), name="planted.only_rank_0_calls_this")


def test_after_the_hang_a_new_launch_goes_on():
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
