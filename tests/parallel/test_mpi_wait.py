"""What Open MPI reads when Horovod starts it is how hvdtrain chose that a
waiting rank polls or yields (--mpi_wait): a choice given overrides the
environment's OMPI_MCA_mpi_yield_when_idle, and Open MPI's own report of the
parameters it took from the environment says what it read.
Own launch: MPI reads it once, at its start, before any test of a shared
launch runs."""

import sys

import pytest

from launch import horovodrun


@pytest.mark.parametrize("choice, read", [("yield", "true"), ("poll", "false")])
def test_open_mpi_reads_the_chosen_way_of_waiting(choice, read):
    given = "0" if choice == "yield" else "1"   # the environment says the opposite
    result = horovodrun(
        [sys.executable, "-c", f"import hvdtrain; hvdtrain.init(mpi_wait={choice!r})"],
        controller="mpi", timeout=120,
        env=dict(OMPI_MCA_mpi_yield_when_idle=given, OMPI_MCA_mpi_show_mca_params="enviro"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"mpi_yield_when_idle={read} (environment)" in output, output[-3000:]
