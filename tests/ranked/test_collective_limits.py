"""Adasum's result, and the combinations Horovod cannot run, refused clearly."""

import traceback

import numpy as np
import pytest

from ranked.support import gathered
from workers import adasum as adasum_worker
from workers import jit_compile


def adasum(a, b):
    """Adasum of two gradients (Maleki et al., 2020), as Horovod computes it per tensor."""
    dot = np.vdot(a, b)
    return (1 - dot / (2 * np.vdot(a, a))) * a + (1 - dot / (2 * np.vdot(b, b))) * b


@pytest.mark.launches(controllers=("mpi",))
def test_adasum_combines_two_ranks_gradients():
    gathered_gradients, reduced_gradients = gathered(adasum_worker.gradients())[0]  # rank 0's
    for both, reduced in zip(gathered_gradients, reduced_gradients):
        assert not np.allclose(both[0], both[1])
        np.testing.assert_allclose(reduced, adasum(both[0], both[1]), rtol=1e-4, atol=1e-6)


def _ended(work, *args):
    """How `work(*args)` ends on each rank, as a worker script doing it would:
    [(exit status, its traceback)] by rank (on every rank)."""
    try:
        work(*args)
        mine = (0, "")
    except Exception as e:
        mine = (1, "".join(traceback.format_exception(e)))
    return gathered(mine)


def _errors(ended):
    return {text.split("UsageError: ", 1)[1] for _, output in ended
            for text in output.splitlines() if "UsageError: " in text}


@pytest.mark.launches(controllers=("gloo",))
def test_adasum_without_mpi_is_refused():
    ended = _ended(adasum_worker.gradients)
    assert any(status != 0 for status, _ in ended)
    assert _errors(ended) == {"op=hvd.Adasum needs Horovod's MPI controller "
                              "(horovodrun --mpi); use hvd.Average with Gloo"}


def test_a_train_step_compiled_whole_by_xla_is_refused_with_the_way_out(controller):
    ended = _ended(jit_compile.train, jit_compile.PAIRS["sgd_momentum"], False, True)
    assert any(status != 0 for status, _ in ended)
    errors = _errors(ended)
    assert len(errors) == 1
    message = errors.pop()
    assert "compile the model with jit_compile=False, then hvdtrain.jit_compile(model)" in message
    assert "--jit_compile" in message
