"""`hvdtrain doctor`: what this machine gives a training job, in one report.

Versions; how Horovod was built (controllers, tensor operations); the
devices TensorFlow sees; the thread settings each process would get; the
horovodrun --config-file in use, checked; and an allreduce self-test on two
local processes started by Horovod's own launcher (`horovod.runner.run`)
under each controller built, with its result checked and its bus bandwidth.
"""

import os
import pathlib
import platform
import time

SELF_TEST_BYTES = 64 * 2**20
SELF_TEST_REPEATS = 5


def report(config_file=None, self_test=True):
    """The report's text. `config_file`: the horovodrun.cfg to check (None:
    ./horovodrun.cfg if there is one)."""
    sections = [("versions", _versions()), ("Horovod build", _horovod_build()),
                ("devices", _devices()), ("threads", _threads()),
                ("horovodrun config", _config(config_file))]
    if self_test:
        sections.append(("allreduce self-test, 2 local processes", _self_tests()))
    width = max(len(k) for _, rows in sections for k, _ in rows)
    lines = []
    for title, rows in sections:
        lines.append(title)
        lines += [f"  {key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)


def _versions():
    import horovod
    import keras
    import numpy as np
    import tensorflow as tf
    from importlib import metadata

    return [("Python", platform.python_version()), ("TensorFlow", tf.__version__),
            ("Keras", keras.__version__), ("Horovod", horovod.__version__),
            ("NumPy", np.__version__), ("hvdtrain", metadata.version("hvdtrain"))]


def _horovod_build():
    import horovod.tensorflow as hvd
    built = lambda flags: ", ".join(name for name, on in flags if on) or "none"  # noqa: E731
    return [("controllers", built([("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built())])),
            ("tensor operations", built([("NCCL", hvd.nccl_built()), ("DDL", hvd.ddl_built()),
                                         ("oneCCL", hvd.ccl_built()), ("MPI", hvd.mpi_built()),
                                         ("Gloo", hvd.gloo_built())])),
            ("GPU support", built([("CUDA", hvd.cuda_built()), ("ROCm", hvd.rocm_built())]))]


def _devices():
    import tensorflow as tf
    rows = []
    for device in tf.config.list_physical_devices():
        details = tf.config.experimental.get_device_details(device)
        rows.append((device.name.removeprefix("/physical_device:"),
                     details.get("device_name") or _cpu_model()))
    return rows


def _cpu_model():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _threads():
    cores = len(os.sched_getaffinity(0))
    return [("cores available", str(cores)),
            ("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "unset")),
            ("intra-op threads", f"cores / processes on the host (2 processes: {max(1, cores // 2)} "
                                 "each); --intra_op_threads to set")]


def _config(config_file):
    from hvdtrain import horovod_config
    from hvdtrain.errors import UsageError
    path = pathlib.Path(config_file or "horovodrun.cfg")
    if config_file is None and not path.exists():
        return [("file", "none here (horovodrun uses its defaults); pass --config_file")]
    try:
        config = horovod_config.check(path)
    except UsageError as e:
        return [("file", str(path.resolve())), ("problem", str(e))]
    params = config.get("params", {})
    return [("file", f"{path.resolve()} (valid)"),
            *[(key, str(value)) for key, value in params.items()]]


def _self_tests():
    import horovod.tensorflow as hvd
    rows = []
    for controller, built in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())):
        if not built:
            continue
        try:
            results = _launch(controller)
        except Exception as e:  # the launcher's failures take many forms
            rows.append((controller, f"FAILED: {str(e).strip().splitlines()[0][:200]}"))
            continue
        correct = all(ok for ok, _ in results)
        seconds = max(s for _, s in results)
        # The bus bandwidth of an allreduce (as nccl-tests reports it): each
        # byte crosses the ring 2 (n - 1) / n times.
        bus = 2 * (len(results) - 1) / len(results) * SELF_TEST_BYTES / seconds
        rows.append((controller, f"{'correct' if correct else 'WRONG SUM'}; "
                                 f"{SELF_TEST_BYTES // 2**20} MiB in {seconds * 1e3:.1f} ms: "
                                 f"bus bandwidth {bus / 1e9:.2f} GB/s"))
    return rows or [("none", "Horovod has no controller built")]


def _launch(controller):
    from horovod.runner import run
    return run(_allreduce_on_rank, np=2, hosts="localhost:2", use_gloo=controller == "Gloo",
               use_mpi=controller == "MPI")


def _allreduce_on_rank():
    """On each process: (sum correct, median seconds) of a float32 allreduce."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    values = tf.fill([SELF_TEST_BYTES // 4], float(hvd.rank() + 1))
    expected = hvd.size() * (hvd.size() + 1) / 2
    hvd.allreduce(values, op=hvd.Sum, name="doctor.warmup")
    seconds = []
    for i in range(SELF_TEST_REPEATS):
        start = time.perf_counter()
        summed = hvd.allreduce(values, op=hvd.Sum, name=f"doctor.{i}").numpy()
        seconds.append(time.perf_counter() - start)
    correct = bool(np.all(summed == expected))
    return correct, float(np.median(seconds))
