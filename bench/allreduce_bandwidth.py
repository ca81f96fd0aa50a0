"""Horovod's allreduce bandwidth at np=2 under Gloo and MPI, against a
memory copy of the same bytes, measured in the same processes.

    python bench/allreduce_bandwidth.py [--controllers=gloo,mpi] [--rounds=10]

launches itself under `horovodrun -np 2` once per controller (one intra-op
thread per process). For each size, 4 KB to 64 MB in powers of 4, each
worker times in interleaved rounds (both ranks at once, started together):
  allreduce  hvd.allreduce of a float32 tensor, op=Sum, in a tf.function;
  copy       np.copyto of a float32 buffer of the same size into another.
The copy is the reference: on one host the processes exchange data through
memory, and every byte an allreduce moves costs at least one copy of it, so
a process copying its own buffer (while the other does the same) is the
fastest any local exchange of those bytes can go.
Reported per size (medians over rounds): time per allreduce; algorithm
bandwidth = bytes / time; bus bandwidth = 2 (n - 1) / n x bytes / time (the
bytes each rank sends and receives, as nccl-tests defines it; at n = 2 it
equals the algorithm bandwidth); copy bandwidth; and bus / copy, the share
of memory-copy speed the collective reaches. Rank 0 of each run writes its
JSON; the launcher prints a table per controller and writes JSON and a
log-log PNG beside it.
"""

import json
import pathlib
import statistics
import time

from absl import app, flags

import horovod_workers

SIZES = [4**k * 1024 for k in range(1, 9)]  # 4 KB .. 64 MB

flags.DEFINE_list("controllers", ["gloo", "mpi"], "Horovod controllers to measure.")
flags.DEFINE_list("sizes", [str(s) for s in SIZES], "Buffer sizes in bytes (multiples of 4).")
flags.DEFINE_integer("rounds", 10, "Interleaved timing rounds (after one warm-up round).")
flags.DEFINE_string("output", "runs/bench/allreduce_bandwidth.json",
                    "The JSON; the PNG goes beside it.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS


def calls_per_sample(size, cap):
    """Enough back-to-back calls that a sample of a small size outlasts the timer's noise."""
    return max(1, min(cap, 2**26 // size))


def measure(sizes, rounds):
    """On every rank of a running Horovod job: {size: {"allreduce": [s], "copy": [s]}},
    seconds per call in each round, after a warm-up round whose sums are checked."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    kinds = {}
    for size in sizes:
        tensor = tf.fill([size // 4], float(hvd.rank() + 1))
        summed = hvd.allreduce(tensor, op=hvd.Sum, name=f"bench.check.{size}")
        if not np.all(summed.numpy() == hvd.size() * (hvd.size() + 1) / 2):
            raise AssertionError(f"allreduce of {size} bytes summed wrongly")
        # The first element only: fetching all of it would add a copy to the host.
        allreduce = tf.function(lambda t, size=size: hvd.allreduce(
            t, op=hvd.Sum, name=f"bench.allreduce.{size}")[0])
        source, target = np.full(size // 4, 1.0, np.float32), np.empty(size // 4, np.float32)
        kinds[size] = {
            "allreduce": (lambda f=allreduce, t=tensor: f(t).numpy(), calls_per_sample(size, 64)),
            "copy": (lambda s=source, t=target: np.copyto(t, s), calls_per_sample(size, 4096)),
        }

    def seconds_per_call(fn, calls):
        hvd.allreduce(tf.constant(0.0), name="bench.sync")  # start the ranks together
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    samples = {size: {kind: [] for kind in fns} for size, fns in kinds.items()}
    for round_index in range(rounds + 1):
        for size, fns in kinds.items():
            for kind, (fn, calls) in fns.items():
                seconds = seconds_per_call(fn, calls)
                if round_index:  # round 0 is the warm-up
                    samples[size][kind].append(seconds)
    return samples


def summarize(size, samples, workers):
    """One size's medians: time, algorithm, bus and copy bandwidth, bus / copy."""
    factor = 2 * (workers - 1) / workers
    allreduce, copy = samples["allreduce"], samples["copy"]
    seconds = statistics.median(allreduce)
    return {"bytes": size, "allreduce_ms": seconds * 1e3,
            "copy_ms": statistics.median(copy) * 1e3,
            "algbw_gbs": size / seconds / 1e9, "busbw_gbs": factor * size / seconds / 1e9,
            "copy_gbs": size / statistics.median(copy) / 1e9,
            # Paired by round, so drift on a busy machine cancels out.
            "bus_over_copy": statistics.median(factor * c / a for a, c in zip(allreduce, copy)),
            "samples_s": samples}


def work():
    import hvdtrain

    hvdtrain.init(intra_op_threads=1)
    samples = measure([int(s) for s in FLAGS.sizes], FLAGS.rounds)
    if hvdtrain.is_main_process():
        rows = [summarize(size, s, hvdtrain.size()) for size, s in samples.items()]
        pathlib.Path(FLAGS.output).write_text(json.dumps(
            {"workers": hvdtrain.size(), "rounds": FLAGS.rounds, "sizes": rows}, indent=1))


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    results = {controller: horovod_workers.run(
        __file__, output.with_suffix(f".{controller}.json"), np=2, controller=controller,
        rounds=FLAGS.rounds, sizes=",".join(FLAGS.sizes)) for controller in FLAGS.controllers}
    for controller, result in results.items():
        print(f"allreduce bandwidth, {controller}, np={result['workers']}, float32 sum "
              f"(medians of {result['rounds']} interleaved rounds; GB/s = 1e9 bytes/s)")
        print(f"{'size':>8}{'ms':>10}{'alg GB/s':>10}{'bus GB/s':>10}{'copy GB/s':>11}"
              f"{'bus/copy':>10}")
        for row in result["sizes"]:
            print(f"{_size(row['bytes']):>8}{row['allreduce_ms']:>10.3f}{row['algbw_gbs']:>10.3g}"
                  f"{row['busbw_gbs']:>10.3g}{row['copy_gbs']:>11.3g}{row['bus_over_copy']:>10.3g}")
    output.write_text(json.dumps({"controllers": results, "baseline": (
        "np.copyto of a float32 buffer of the same size, in each worker while the other "
        "does the same, interleaved with the allreduces")}, indent=1))
    plot(results, output.with_suffix(".png"))
    print("bus/copy = bus bandwidth / memory-copy bandwidth of the same bytes in the same "
          f"processes. JSON: {output}, chart: {output.with_suffix('.png')}")


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for controller, result in results.items():
        rows = result["sizes"]
        axes.plot([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows], "o-",
                  label=f"allreduce, {controller} (bus bandwidth)")
    # One reference line: every run's copy samples of a size, pooled.
    sizes = [r["bytes"] for r in next(iter(results.values()))["sizes"]]
    copies = [statistics.median(s / c / 1e9 for result in results.values()
                                for r in result["sizes"] if r["bytes"] == s
                                for c in r["samples_s"]["copy"]) for s in sizes]
    axes.plot(sizes, copies, "k--", label="memory copy of the same bytes (baseline)")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(sizes, [_size(s) for s in sizes])
    axes.set_xlabel("buffer size")
    axes.set_ylabel("GB/s")
    axes.set_title("float32 allreduce at np=2 on one host, 1 intra-op thread per process; "
                   "medians", fontsize=9)
    axes.legend(fontsize=8)
    axes.grid(True, which="major", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def _size(size):
    return f"{size // 2**20} MB" if size >= 2**20 else f"{size // 1024} KB"


def main(argv):
    work() if FLAGS.worker else launch()


if __name__ == "__main__":
    app.run(main)
