"""Adasum's result, and the combinations Horovod cannot run, refused clearly."""

import re

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


def test_a_train_step_compiled_whole_by_xla_is_refused_with_the_way_out(controller):
    result = horovodrun([*worker("jit_compile"), "whole"], controller=controller)
    assert result.returncode != 0
    errors = _errors(result)
    assert len(errors) == 1
    message = errors.pop()
    assert "compile the model with jit_compile=False, then hvdtrain.jit_compile(model)" in message
    assert "--jit_compile" in message


def test_xla_compiles_all_but_the_collectives_and_changes_no_step(tmp_path):
    # Each compiled model is two XLA computations on each rank: its forward
    # and backward pass, and its optimizer's update.
    result = horovodrun([*worker("jit_compile"), "split", tmp_path],
                        env={"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "device_compiler=1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        compiled = [int(n) for r, text in rank_lines(result.stdout + result.stderr) if r == rank
                    for n in re.findall(r"Compilation of XLA executable .*#called: (\d+)", text)]
        assert max(compiled) == 2 * 3, rank
    rank0, rank1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    for name in rank0.files:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)
        pair, jit, index = name.split(":")
        if jit == "True":
            np.testing.assert_allclose(rank0[name], rank0[f"{pair}:False:{index}"], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
