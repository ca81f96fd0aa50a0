"""GPU placement, MPI's waiting and precision rules of hvdtrain.runtime, and the doctor's
NCCL version decoding: the parts of the GPU code paths that run without a GPU."""

import os

import pytest

from hvdtrain import runtime
from hvdtrain.errors import UsageError
from hvdtrain.tools import doctor


@pytest.mark.parametrize("visible, local_rank, local_size, cuda_visible_devices, expected", [
    (8, 3, 8, None, 3),          # a GPU per local process: the local rank's
    (8, 1, 4, None, 1),          # more GPUs than processes
    (1, 0, 1, None, 0),          # one process, one GPU
    (1, 5, 8, "5", 0),           # the scheduler gave each process its own GPU
    (2, 1, 2, "2,3", 1),         # ... or its node's share of them
])
def test_each_process_gets_its_own_gpu(visible, local_rank, local_size, cuda_visible_devices,
                                       expected):
    assert runtime.gpu_index(visible, local_rank, local_size, cuda_visible_devices) == expected


@pytest.mark.parametrize("visible, local_size, cuda_visible_devices", [
    (1, 2, None),     # two processes would share the host's only GPU
    (2, 4, None),
    (2, 4, "0,1"),
])
def test_processes_sharing_a_gpu_are_refused_in_one_line(visible, local_size,
                                                         cuda_visible_devices):
    with pytest.raises(UsageError, match=rf"^{local_size} processes on this host share "
                                         rf"{visible} GPUs?: start one process per GPU"):
        runtime.gpu_index(visible, 0, local_size, cuda_visible_devices)


@pytest.mark.parametrize("policy, capability, slow", [
    ("mixed_float16", (6, 0), True),
    ("mixed_float16", (7, 0), False),
    ("mixed_bfloat16", (7, 5), True),
    ("mixed_bfloat16", (9, 0), False),
    ("float32", (6, 0), False),
    ("mixed_float16", None, False),   # no capability reported: nothing to say
])
def test_a_precision_without_tensor_cores_is_named(policy, capability, slow):
    warning = runtime.precision_warning(policy, capability, "Tesla P100")
    assert (warning is not None) == slow
    if slow:
        assert policy in warning and "Tesla P100" in warning


@pytest.mark.parametrize("code, version", [(23203, "2.32.3"), (21805, "2.18.5"),
                                           (2804, "2.8.4")])
def test_nccl_version_codes_decode(code, version):
    assert doctor.nccl_version(code) == version


@pytest.mark.parametrize("choice, threads, local_size, cores, wait", [
    ("auto", 1, 2, 2, "yield"),    # 2 x (1 + Horovod's thread) on 2 cores: none free
    ("auto", 1, 2, 4, "poll"),     # a core for each background thread
    ("auto", 4, 2, 8, "yield"),    # the default threads (cores / workers) fill the host
    ("auto", 3, 2, 8, "poll"),
    ("poll", 4, 2, 8, "poll"),
    ("yield", 1, 1, 64, "yield"),
])
def test_mpi_ranks_poll_only_where_a_core_is_free(choice, threads, local_size, cores, wait):
    assert runtime.choose_mpi_wait(choice, threads, local_size, cores) == wait


@pytest.fixture
def mpirun_on_2_cores(monkeypatch):
    """This process as one of 2 ranks mpirun started on a 2-core host."""
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})


def test_open_mpi_is_told_to_yield_where_polling_would_take_a_workers_core(mpirun_on_2_cores):
    said = runtime._set_mpi_wait("auto", 0)
    assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert said == ("MPI ranks yield their core while they wait (2 on this host x (1 intra-op + "
                    "1 Horovod thread) on 2 cores, --mpi_wait=auto)")


def test_open_mpis_own_setting_in_the_environment_is_kept_unless_a_choice_is_given(
        mpirun_on_2_cores, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")
    assert runtime._set_mpi_wait("auto", 1) is None
    assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "0"
    assert runtime._set_mpi_wait("yield", 1).startswith("MPI ranks yield their core")
    assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_nothing_is_set_outside_open_mpis_mpirun(mpirun_on_2_cores, monkeypatch):
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
    assert runtime._set_mpi_wait("yield", 1) is None
    assert "OMPI_MCA_mpi_yield_when_idle" not in os.environ


@pytest.mark.parametrize("gpus, threads, local_size, cores, overlap", [
    (0, 1, 2, 2, False),    # 2 workers x (1 + Horovod's thread) on 2 cores: one group
    (0, 0, 2, 8, False),    # TensorFlow's default threads take every core
    (0, 1, 2, 4, True),     # a core for each worker's Horovod threads: overlap
    (1, 0, 8, 8, True),     # on GPUs the exchange runs beside the compute
])
def test_gradients_overlap_backprop_where_the_exchange_has_room(
        monkeypatch, gpus, threads, local_size, cores, overlap):
    import horovod.tensorflow as hvd
    import tensorflow as tf

    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind: [f"/device:GPU:{i}" for i in range(gpus)])
    monkeypatch.setattr(tf.config.threading, "get_intra_op_parallelism_threads", lambda: threads)
    monkeypatch.setattr(hvd, "local_size", lambda: local_size)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert runtime.gradients_overlap_backprop() is overlap


@pytest.mark.parametrize("overlap, groups, num_groups, split", [
    (True, "auto", 0, [[0], [1], [2]]),   # each gradient's allreduce as backprop makes it
    (False, "auto", 0, [[0, 1, 2]]),      # all of them at once
    (False, None, 0, [[0], [1], [2]]),    # Horovod's None, asked for by name
    (True, "auto", 2, [[0], [1, 2]]),     # Horovod's older num_groups
    (True, 3, 0, [[0], [1], [2]]),
])
def test_the_default_groups_follow_the_host(monkeypatch, overlap, groups, num_groups, split):
    from hvdtrain.parallel.data_parallel.reduction import GradientReducer, chosen_groups

    monkeypatch.setattr(runtime, "gradients_overlap_backprop", lambda: overlap)
    reducer = GradientReducer(groups=chosen_groups(groups, num_groups))
    assert reducer._split([0, 1, 2], None) == split
