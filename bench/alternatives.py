"""hvdtrain against what users would pick instead, measured side by side.

    python bench/alternatives.py [--contenders=hvdtrain,horovod_ops,mwms,horovod_keras2]
                                 [--rounds=3]

Trains the same small CNN on the same fixed random 32x32x3 data, with SGD
momentum, a batch of 64 per worker, 2 processes with one intra-op thread
each, by `model.fit` under each contender (bench/alternatives_worker.py):
  hvdtrain         Keras 3 + hvdtrain.DistributedOptimizer, launched as hvdtrain
                   jobs are: horovodrun --config-file horovodrun.cfg -np 2
  horovod_ops      Keras 3 + a train_step averaging the gradients with one
                   horovod.tensorflow.grouped_allreduce, launched alike: Horovod's
                   engine alone, so that hvdtrain / it is what hvdtrain adds or costs
  mwms             Keras 3 + tf.distribute.MultiWorkerMirroredStrategy (RING
                   collectives on CPU), 2 workers on loopback
  horovod_keras2   horovod.tensorflow.keras on TensorFlow 2.15 (tf.keras 2),
                   horovodrun -np 2 (Horovod's defaults), in the virtualenv
                   bench/keras2_env.sh builds
Every worker times windows of steps after warm-up steps, as hvdtrain's
throughput does; a run's total is the median over windows of the workers'
summed rates (a burst of other load on the machine spoils a window, not the
run). Each worker also records its process's CPU time per step, which
depends less than the rate on other load, and how its threads split it:
TensorFlow's op threads (compute), the main thread (python), the rest
(other: Horovod's background thread and its controller's, or the
strategy's collective and gRPC threads); TensorFlow 2.15 names no thread,
so the Keras 2 contender's is not split. Runs are interleaved in rounds,
the order rotated each round (A B C, B C A, ...), so that drift on a busy
machine hits all alike. The report gives each contender's median over
rounds, and hvdtrain / each other as the geometric mean of the rounds'
ratios with its 95% interval (Student's t on their logs): a slow stretch of
the machine spoils one round's ratio, not the comparison. Goal: >= 1.0;
the verdict is "met" (mean >= 1), "NOT met" (the whole interval below 1),
or "within noise" (below 1, but the interval reaches it).
Prints a table and writes JSON and a PNG bar chart beside it. A missing
Keras 2 environment leaves that contender out, with the reason, in the table
and the JSON.
"""

import contextlib
import json
import math
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

CONTENDERS = ("hvdtrain", "horovod_ops", "mwms", "horovod_keras2")
LABELS = {"hvdtrain": "hvdtrain (Keras 3)", "horovod_ops": "Horovod's ops alone (Keras 3)",
          "mwms": "MultiWorkerMirrored (Keras 3)",
          "horovod_keras2": "Horovod tf.keras 2 (TF 2.15)"}
WORKER = pathlib.Path(__file__).with_name("alternatives_worker.py")
HOROVODRUN_CONFIG = pathlib.Path(__file__).parent.parent / "horovodrun.cfg"
WORKERS = 2
THREAD_KINDS = ("compute", "python", "other")

flags.DEFINE_list("contenders", list(CONTENDERS),
                  "Which of hvdtrain, horovod_ops, mwms, horovod_keras2 to run.")
flags.DEFINE_integer("rounds", 5, "Interleaved rounds (one run of each contender per round).")
flags.DEFINE_integer("batch_size", 64, "Examples per worker and step.")
flags.DEFINE_integer("warmup_steps", 10, "Steps left out at the start of each run.")
flags.DEFINE_integer("window_steps", 10, "Steps per timed window.")
flags.DEFINE_integer("windows", 5, "Timed windows per run.")
flags.DEFINE_integer("examples", 1024, "Size of the fixed random data set.")
flags.DEFINE_enum("controller", "gloo", ["gloo", "mpi"],
                  "Horovod's controller, for both Horovod contenders.")
flags.DEFINE_string("keras2_venv", None,
                    "The Keras 2 virtualenv (default: where bench/keras2_env.sh builds it: "
                    "$HVDTRAIN_KERAS2_VENV or ~/.cache/hvdtrain/keras2-venv).")
flags.DEFINE_integer("timeout", 900, "Seconds one run may take.")
flags.DEFINE_string("output", "runs/bench/alternatives.json", "The JSON; the PNG goes beside it.")
FLAGS = flags.FLAGS


class RunFailed(RuntimeError):
    pass


def keras2_venv():
    """Where bench/keras2_env.sh puts the Keras 2 environment (same defaults)."""
    if FLAGS.keras2_venv:
        return pathlib.Path(FLAGS.keras2_venv)
    if "HVDTRAIN_KERAS2_VENV" in os.environ:
        return pathlib.Path(os.environ["HVDTRAIN_KERAS2_VENV"])
    cache = os.environ.get("HVDTRAIN_CACHE") or pathlib.Path(
        os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache", "hvdtrain")
    return pathlib.Path(cache, "keras2-venv")


def check_keras2_env(venv):
    """None if `venv` runs horovod.tensorflow.keras on tf.keras 2, else why not."""
    build = "build it with `bash bench/keras2_env.sh`"
    if not (venv / "bin" / "horovodrun").exists():
        return f"no Keras 2 environment at {venv}; {build}"
    probe = ("import keras, horovod.tensorflow.keras as hvd\n"
             "assert keras.__version__.startswith('2.'), keras.__version__\n"
             "assert hvd.gloo_built() and hvd.mpi_built()")
    result = subprocess.run([venv / "bin" / "python", "-c", probe], capture_output=True,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.returncode:
        # The exception's own line: the last that is not indented.
        error = ([line for line in result.stderr.splitlines() if line[:1].strip()] or ["?"])[-1]
        return f"the Keras 2 environment at {venv} does not work ({error}); {build}"
    return None


def worker_flags(mode, prefix):
    return [WORKER, f"--mode={mode}", f"--output={prefix}", f"--batch_size={FLAGS.batch_size}",
            f"--warmup_steps={FLAGS.warmup_steps}", f"--window_steps={FLAGS.window_steps}",
            f"--windows={FLAGS.windows}", f"--examples={FLAGS.examples}"]


def worker_env(bin_dir=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    if bin_dir:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def run_processes(name, commands, log):
    """Runs `commands` ([command, env] pairs) together, their output going to
    `log`; raises RunFailed unless all exit 0 within --timeout."""
    with open(log, "w") as out:
        processes = [subprocess.Popen([str(c) for c in command], env=env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
                     for command, env in commands]
        deadline = time.monotonic() + FLAGS.timeout
        try:
            # Until all are done, one failed (its peers would wait for it forever) or time is up.
            while (any(p.poll() is None for p in processes) and not any(p.poll() for p in processes)
                   and time.monotonic() < deadline):
                time.sleep(0.5)
        finally:
            for p in processes:
                end(p)
    statuses = [p.returncode for p in processes]
    if any(statuses):
        raise RunFailed(f"{name} exited with {statuses} (negative: ended after a peer failed or "
                        f"after --timeout={FLAGS.timeout} s):\n{tail(log)}")


def end(process):
    """Ends `process` and its session (horovodrun's workers) if still running."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)


def run_horovod(mode, prefix, log, bin_dir, config=()):
    command = [bin_dir / "horovodrun", *config, "-np", WORKERS, "-H", f"localhost:{WORKERS}",
               f"--{FLAGS.controller}", bin_dir / "python", *worker_flags(mode, prefix)]
    run_processes(mode, [(command, worker_env(bin_dir))], log)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_mwms(prefix, log):
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(WORKERS)]}
    command = [sys.executable, *worker_flags("mwms", prefix)]
    run_processes("mwms", [(command, {**worker_env(), "TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}})})
        for index in range(WORKERS)], log)


def tail(log, lines=30):
    return "\n".join(pathlib.Path(log).read_text(errors="replace").splitlines()[-lines:])


def run_once(mode, scratch, round_index):
    """One run of `mode`: its total examples/s and the wall time of the run."""
    prefix = scratch / f"{mode}.{round_index}"
    log = prefix.with_suffix(".log")
    start = time.perf_counter()
    if mode == "mwms":
        run_mwms(prefix, log)
    elif mode == "horovod_keras2":
        run_horovod(mode, prefix, log, keras2_venv() / "bin")
    else:
        run_horovod(mode, prefix, log, pathlib.Path(sys.executable).parent,
                    config=("--config-file", HOROVODRUN_CONFIG))
    seconds = time.perf_counter() - start
    ranks = [json.loads(pathlib.Path(f"{prefix}.rank{r}.json").read_text()) for r in range(WORKERS)]
    checksums = [r["weights_checksum"] for r in ranks]
    if max(checksums) - min(checksums) > 1e-6 * max(1.0, abs(checksums[0])):
        raise RunFailed(f"{mode}: the ranks ended with different weights ({checksums})")
    windows = min(len(r["rates"]) for r in ranks)
    if not windows:
        raise RunFailed(f"{mode} timed no window: raise --windows or lower --warmup_steps")
    totals = [sum(r["rates"][w] for r in ranks) for w in range(windows)]
    cpu_ms = [1000 * statistics.fmean(r["cpu_per_step"][w] for r in ranks) for w in range(windows)]
    return {"examples_per_second": statistics.median(totals), "window_totals": totals,
            "cpu_ms_per_step": statistics.median(cpu_ms),
            "cpu_ms_per_step_by_kind": by_kind([r["cpu_per_step_by_kind"] for r in ranks],
                                               lambda s: 1000 * statistics.fmean(s)),
            "wall_seconds": seconds, "versions": {k: ranks[0][k] for k in ("tensorflow", "keras")}}


def by_kind(splits, combine):
    """{thread kind: `combine` of the `splits`' CPU times of that kind}, or
    None if any split is (a TensorFlow that names no thread)."""
    if any(split is None for split in splits):
        return None
    return {kind: combine([split.get(kind, 0.0) for split in splits]) for kind in THREAD_KINDS}


def paired_ratio(ours, theirs):
    """Rounds' ratios ours / theirs: their geometric mean, its 95% interval
    (None from one round) and the verdict on the goal >= 1."""
    from scipy import stats

    logs = [math.log(a / b) for a, b in zip(ours, theirs)]
    mean = statistics.fmean(logs)
    low = high = None
    if len(logs) > 1:
        half = float(stats.t.ppf(0.975, len(logs) - 1) * stats.sem(logs))
        low, high = math.exp(mean - half), math.exp(mean + half)
    verdict = ("met" if mean >= 0 else "NOT met" if high is None or high < 1
               else "within noise")
    return {"ratio": math.exp(mean), "low": low, "high": high, "verdict": verdict,
            "rounds": [a / b for a, b in zip(ours, theirs)]}


def summarize(runs, missing):
    """Medians over rounds, and hvdtrain's ratio to each other contender."""
    contenders = {}
    for mode, rounds in runs.items():
        median = statistics.median(r["examples_per_second"] for r in rounds)
        contenders[mode] = {"examples_per_second": median, "per_worker": median / WORKERS,
                            "cpu_ms_per_step": statistics.median(
                                r["cpu_ms_per_step"] for r in rounds),
                            "cpu_ms_per_step_by_kind": by_kind(
                                [r["cpu_ms_per_step_by_kind"] for r in rounds],
                                statistics.median),
                            "versions": rounds[0]["versions"], "rounds": rounds}
    ratios = {}
    if "hvdtrain" in runs:
        ours = [r["examples_per_second"] for r in runs["hvdtrain"]]
        ratios = {f"hvdtrain/{mode}": paired_ratio(ours, [r["examples_per_second"] for r in rounds])
                  for mode, rounds in runs.items() if mode != "hvdtrain"}
    return {"contenders": contenders, "ratios": ratios, "missing": missing,
            "goal": "hvdtrain / each other >= 1.0",
            "setup": {"workers": WORKERS, "intra_op_threads": 1,
                      "batch_per_worker": FLAGS.batch_size, "examples": FLAGS.examples,
                      "warmup_steps": FLAGS.warmup_steps, "window_steps": FLAGS.window_steps,
                      "windows": FLAGS.windows, "rounds": FLAGS.rounds,
                      "horovod_controller": FLAGS.controller,
                      "optimizer": "SGD(0.01, momentum=0.9)",
                      "model": "4 conv + 2 dense CNN on 32x32x3"}}


def _split(kinds):
    """compute/python/other ms, or why not (TensorFlow before 2.16 names no thread)."""
    return "unnamed threads" if kinds is None else "/".join(f"{v:.1f}" for v in kinds.values())


def report(results):
    contenders, ratios = results["contenders"], results["ratios"]
    print(f"training throughput, np={WORKERS} x 1 intra-op thread, batch {FLAGS.batch_size} per "
          f"worker, examples/s in total (each run: its median window; median of {FLAGS.rounds} "
          "interleaved rounds)")
    print(f"{'contender':<32}{'versions':<25}{'examples/s':>11}{'rounds':>12}{'per worker':>11}"
          f"{'hvdtrain / it':>15}{'CPU ms/step':>13}{'compute/python/other':>22}")
    for mode, c in contenders.items():
        versions = f"TF {c['versions']['tensorflow']}, Keras {c['versions']['keras']}"
        rates = [r["examples_per_second"] for r in c["rounds"]]
        ratio = ratios.get(f"hvdtrain/{mode}", {}).get("ratio")
        print(f"{LABELS[mode]:<32}{versions:<25}{c['examples_per_second']:>11.1f}"
              f"{f'{min(rates):.0f}-{max(rates):.0f}':>12}{c['per_worker']:>11.1f}"
              f"{'' if ratio is None else f'{ratio:.3f}':>15}{c['cpu_ms_per_step']:>13.0f}"
              f"{_split(c['cpu_ms_per_step_by_kind']):>22}")
    for mode, why in results["missing"].items():
        print(f"{LABELS[mode]:<32}not measured: {why}")
    verdicts = [f"{name} = {r['ratio']:.3f}" + (
        "" if r["low"] is None else f" (95% interval {r['low']:.3f}-{r['high']:.3f})")
        + f": {r['verdict']}" for name, r in ratios.items()]
    print(f"goal: hvdtrain / each other >= 1.0; {'; '.join(verdicts) or 'no ratio measured'}")
    print("CPU ms/step: one worker process's CPU time (all threads) per step, which depends "
          "less than examples/s on other load on the machine; lower is better. Split by "
          "threads: TensorFlow's op threads / the main thread / the rest (the collectives' "
          "engine and transport, tf.data)")
    print(f"wall time {results['wall_seconds']:.0f} s. JSON: {FLAGS.output}, chart: "
          f"{pathlib.Path(FLAGS.output).with_suffix('.png')}")


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    contenders = results["contenders"]
    modes = list(contenders)
    colors = ["tab:blue" if m == "hvdtrain" else "tab:gray" for m in modes]
    labels = [LABELS[m].replace(" (", "\n(") for m in modes]
    figure, (rates, cpu) = pyplot.subplots(1, 2, figsize=(10, 4.2),
                                           gridspec_kw={"width_ratios": [3, 2]})
    medians = [contenders[m]["examples_per_second"] for m in modes]
    rates.bar(range(len(modes)), medians, color=colors)
    for i, mode in enumerate(modes):
        rounds = [r["examples_per_second"] for r in contenders[mode]["rounds"]]
        rates.plot([i] * len(rounds), rounds, "k.", label="one round" if i == 0 else None)
        ratio = results["ratios"].get(f"hvdtrain/{mode}", {}).get("ratio")
        rates.text(i, medians[i] / 2, f"median\n{medians[i]:.0f}"
                   + ("" if ratio is None else f"\n\nhvdtrain / it\n= {ratio:.2f}"),
                   ha="center", va="center", color="white", fontsize=9)
    rates.set_xticks(range(len(modes)), labels, fontsize=8)
    rates.set_ylabel(f"examples/s, {WORKERS} workers in total (higher is better)")
    rates.legend(loc="best", fontsize=8)
    cpu.bar(range(len(modes)), [contenders[m]["cpu_ms_per_step"] for m in modes], color=colors)
    cpu.set_xticks(range(len(modes)), labels, fontsize=8)
    cpu.set_ylabel("CPU ms per step and worker (lower is better)")
    figure.suptitle(f"Same CNN, data and SGD momentum; np={WORKERS}, 1 intra-op thread each, "
                    f"batch {FLAGS.batch_size}/worker; median of {FLAGS.rounds} rounds",
                    fontsize=10)
    if results["missing"]:
        figure.text(0.01, 0.01, "not measured: " + ", ".join(LABELS[m] for m in results["missing"])
                    + " (reason in the JSON)", fontsize=7, color="tab:red")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def main(argv):
    unknown = set(FLAGS.contenders) - set(CONTENDERS)
    if unknown:
        raise app.UsageError(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    start = time.perf_counter()
    modes = [m for m in CONTENDERS if m in FLAGS.contenders]
    missing = {}
    if "horovod_keras2" in modes:
        why = check_keras2_env(keras2_venv())
        if why:
            missing["horovod_keras2"] = why
            modes.remove("horovod_keras2")
            print(f"horovod_keras2 left out: {why}", file=sys.stderr)
    if not modes:
        sys.exit("nothing to measure: " + "; ".join(f"{m}: {why}" for m, why in missing.items()))
    runs = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(FLAGS.rounds):
            for mode in modes[round_index % len(modes):] + modes[:round_index % len(modes)]:
                runs[mode].append(run_once(mode, pathlib.Path(scratch), round_index))
                print(f"round {round_index + 1}/{FLAGS.rounds} {mode}: "
                      f"{runs[mode][-1]['examples_per_second']:.1f} examples/s", flush=True)
    results = summarize(runs, missing)
    results["wall_seconds"] = time.perf_counter() - start
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    plot(results, output.with_suffix(".png"))
    report(results)


if __name__ == "__main__":
    app.run(main)
