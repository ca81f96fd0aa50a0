"""Adasum's result, and the combinations Horovod cannot run, refused clearly."""

import numpy as np
import pytest

from launch import horovodrun, rank_lines, worker


def adasum(a, b):
    """Adasum of two gradients (Maleki et al., 2020), as Horovod computes it per tensor."""
    dot = np.vdot(a, b)
    return (1 - dot / (2 * np.vdot(a, a))) * a + (1 - dot / (2 * np.vdot(b, b))) * b


def test_adasum_combines_two_ranks_gradients(tmp_path):
    result = horovodrun([*worker("adasum"), tmp_path / "adasum.npz"], controller="mpi")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    arrays = np.load(tmp_path / "adasum.npz")
    half = len(arrays.files) // 2
    for i in range(half):
        both, reduced = arrays[f"arr_{i}"], arrays[f"arr_{i + half}"]
        assert not np.allclose(both[0], both[1])
        np.testing.assert_allclose(reduced, adasum(both[0], both[1]), rtol=1e-4, atol=1e-6)


def _errors(result):
    output = result.stdout + result.stderr
    return {text.split("UsageError: ", 1)[1] for _, text in rank_lines(output)
            if "UsageError: " in text}


def test_adasum_without_mpi_is_refused(tmp_path):
    result = horovodrun([*worker("adasum"), tmp_path / "adasum.npz"], controller="gloo")
    assert result.returncode != 0
    assert _errors(result) == {"op=hvd.Adasum needs Horovod's MPI controller "
                               "(horovodrun --mpi); use hvd.Average with Gloo"}


@pytest.mark.parametrize("jit", ["1", "0"])
def test_jit_compile_is_refused_with_a_clear_error(jit, controller):
    result = horovodrun([*worker("jit_compile"), jit], controller=controller)
    if jit == "0":
        assert result.returncode == 0 and result.stdout.count("trained") == 2
        return
    assert result.returncode != 0
    errors = _errors(result)
    assert len(errors) == 1 and "compile the model with jit_compile=False" in errors.pop()
