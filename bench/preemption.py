"""What preemption-safe training costs and how fast a signal stops it, at np=2.

    python bench/preemption.py [--controllers=gloo,mpi] [--rounds=3]

runs `hvdtrain train` on the digits_cnn recipe (one intra-op thread per
process) under `horovodrun -np 2`, for each controller:
  stop vote   the same training with the ranks' stop vote in every step (the
              default --preemption_signals) and without it
              (--preemption_signals=: no handler, no vote), alternated in
              rounds, each round's first run swapped, so drift on a busy
              machine hits both. Step time = global batch / the run's
              reported throughput (windows of steps inside epochs, so
              epoch-end work is left out); per round the ratio with / without,
              and the noise: the two rates' 95% intervals (their half-widths
              relative to the rate) combined. Goal:
              with the vote at most that much slower (the median round).
  signal      a training is started (a checkpoint every 10 steps) and, once
              the first checkpoint exists, signalled: by default SIGTERM to
              rank 1 twice, then SIGUSR1 to rank 0 (--stops). Timed
              from the kill: rank 0's line saying the ranks stopped (the
              checkpoint is written), and horovodrun's exit. Goal: the exit
              within one step (the stop vote runs' median) + the checkpoint's
              save time (rank 0's last "written in" line) + 2 s. The ranks
              must exit with status 200: horovodrun names the first to exit
              non-zero (under Gloo "horovodrun: rank N exited with status S";
              under MPI, mpirun's report), and exits with its status.
The launcher prints a table per controller and writes JSON.
"""

import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from hvdtrain.faults.preemption import EXIT_STATUS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from launch import REPO, environment, rank_lines, rank_pid, wait_until  # noqa: E402

RECIPE = "digits_cnn"
SLACK_SECONDS = 2.0

flags.DEFINE_list("controllers", ["gloo"], "Horovod controllers to measure (gloo, mpi).")
flags.DEFINE_integer("rounds", 3, "Rounds of the vote's cost: one run with it, one without.")
flags.DEFINE_integer("epochs", 5, "Epochs of each run timed for the vote's cost.")
flags.DEFINE_list("stops", ["SIGTERM:1", "SIGTERM:1", "SIGUSR1:0"],
                  "The signalled runs, one per SIGNAL:RANK.")
flags.DEFINE_string("output", "runs/bench/preemption.json", "Where the results go.")
FLAGS = flags.FLAGS

_THROUGHPUT = re.compile(r"hvdtrain: throughput ([\d.]+) examples/s "
                         r"\(95% interval ([\d.]+)-([\d.]+)\)")
_GLOBAL_BATCH = re.compile(r"global batch (\d+)")
_SAVED = re.compile(r"checkpoint (\S+) written in ([\d.]+) s")
_STOPPED = re.compile(r"hvdtrain: preempted\b.*?after (epoch \d+, step \d+)")
_GLOO_STATUS = re.compile(r"^horovodrun: rank (\d+) exited with status (\d+)$", re.MULTILINE)
_MPI_STATUS = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)")
_CHECKPOINT = re.compile(r"epoch-\d+-step-\d+")


def horovodrun(controller, model_dir, *flags_):
    """Starts `hvdtrain train` on RECIPE at np=2, its output piped."""
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", f"--{controller}",
               "hvdtrain", "train", f"--recipe={RECIPE}", f"--model_dir={model_dir}",
               "--intra_op_threads=1", "--noexport", *flags_]
    return subprocess.Popen(command, cwd=REPO, env=environment(None), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def vote_run(controller, model_dir, vote):
    """One run with or without the vote: its step ms from the reported
    throughput, with that rate's 95% interval (a rate interval reaching 0, as
    a short run on a busy machine gives, leaves the step's unbounded: None),
    and the interval's half-width relative to the rate."""
    signals = [] if vote else ["--preemption_signals="]
    process = horovodrun(controller, model_dir, f"--epochs={FLAGS.epochs}", *signals)
    output, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"training failed (status {process.returncode}):\n{output[-3000:]}")
    text = "\n".join(line for rank, line in rank_lines(output) if rank == 0)
    rate, low, high = map(float, _THROUGHPUT.search(text).groups())
    batch = int(_GLOBAL_BATCH.search(text).group(1))
    return {"step_ms": 1e3 * batch / rate,
            "interval_ms": [1e3 * batch / high, 1e3 * batch / low if low > 0 else None],
            "noise": (high - low) / 2 / rate, "global_batch": batch}


def vote_cost(controller, scratch):
    rounds = []
    for index in range(FLAGS.rounds):
        runs = {}
        for vote in (True, False)[::1 if index % 2 == 0 else -1]:
            runs["on" if vote else "off"] = vote_run(
                controller, scratch / f"vote-{index}-{vote}", vote)
        on, off = runs["on"], runs["off"]
        rounds.append(dict(runs, ratio=on["step_ms"] / off["step_ms"],
                           noise=(on["noise"] ** 2 + off["noise"] ** 2) ** 0.5))
    ratios = [r["ratio"] for r in rounds]
    ratio, noise = statistics.median(ratios), statistics.median(r["noise"] for r in rounds)
    return {"rounds": rounds, "ratio": ratio, "noise": noise,
            "within_noise": ratio - 1 <= noise,
            "step_ms": {kind: statistics.median(r[kind]["step_ms"] for r in rounds)
                        for kind in ("on", "off")}}


def stop_run(controller, model_dir, signal_name, rank, step_seconds):
    """One training signalled once its first checkpoint exists: the timings."""
    process = horovodrun(controller, model_dir, "--checkpoint_steps=10")
    lines = []   # (time.monotonic(), line) as horovodrun prints them
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), line) for line in process.stdout))
    reader.start()
    checkpoints = model_dir / "checkpoints"
    if not wait_until(lambda: checkpoints.is_dir() and any(
            _CHECKPOINT.fullmatch(p.name) for p in checkpoints.iterdir()), 180, 0.01):
        process.kill()
        raise RuntimeError("no checkpoint within 180 s")
    pid = rank_pid(rank, str(model_dir))
    killed = time.monotonic()
    os.kill(pid, signal.Signals[signal_name])
    status = process.wait(timeout=120)
    exit_seconds = time.monotonic() - killed
    reader.join()
    output = "".join(line for _, line in lines)
    rank0 = [(at - killed, text) for at, line in lines for r, text in rank_lines(line) if r == 0]
    saves = [_SAVED.search(text) for _, text in rank0]
    path, save_seconds = [m for m in saves if m][-1].groups()
    stopped = [(seconds, m.group(1)) for seconds, text in rank0
               if (m := _STOPPED.search(text))]
    if not stopped:
        raise RuntimeError(f"rank 0 did not stop on {signal_name}:\n{output[-3000:]}")
    # The launcher names the first rank to exit non-zero.
    statuses = {int(r): int(s) for r, s in
                (_GLOO_STATUS if controller == "gloo" else _MPI_STATUS).findall(output)}
    budget = step_seconds + float(save_seconds) + SLACK_SECONDS
    return {"signal": signal_name, "rank": rank, "stopped_after": stopped[0][1],
            "checkpoint": pathlib.Path(path).name, "save_seconds": float(save_seconds),
            "stopped_seconds": stopped[0][0], "exit_seconds": exit_seconds,
            "budget_seconds": budget, "margin_seconds": budget - exit_seconds,
            "horovodrun_status": status, "rank_statuses": statuses,
            "ranks_preempted": status == EXIT_STATUS and set(statuses.values()) == {EXIT_STATUS}}


def measure(controller, scratch):
    vote = vote_cost(controller, scratch)
    step_seconds = vote["step_ms"]["on"] / 1e3
    stops = []
    for index, stop in enumerate(FLAGS.stops):
        signal_name, rank = stop.split(":")
        stops.append(stop_run(controller, scratch / f"stop-{index}", signal_name, int(rank),
                              step_seconds))
    exits = [s["exit_seconds"] for s in stops]
    return {"vote": vote, "stops": stops, "step_seconds": step_seconds,
            "worst_exit_seconds": max(exits), "median_exit_seconds": statistics.median(exits),
            "goal_met": all(s["margin_seconds"] >= 0 for s in stops),
            "all_ranks_preempted": all(s["ranks_preempted"] for s in stops)}


def report(controller, r):
    vote = r["vote"]
    print(f"stop vote's cost per step, {controller}, np=2, {RECIPE} (global batch "
          f"{vote['rounds'][0]['on']['global_batch']}), {FLAGS.epochs} epochs a run; "
          "step ms (95% interval)")
    print(f"{'round':<7}{'vote on':>22}{'vote off':>22}{'on/off':>8}{'noise':>8}")
    for index, rnd in enumerate(vote["rounds"]):
        on, off = (f"{x['step_ms']:.2f} ({x['interval_ms'][0]:.2f}-"
                   f"{x['interval_ms'][1] or float('inf'):.2f})" for x in (rnd["on"], rnd["off"]))
        print(f"{index + 1:<7}{on:>22}{off:>22}{rnd['ratio']:>8.3f}{rnd['noise']:>8.1%}")
    ratios = [rnd["ratio"] for rnd in vote["rounds"]]
    verdict = "met" if vote["within_noise"] else "NOT met"
    if vote["ratio"] < 1 - vote["noise"]:
        verdict += " (faster with the vote, beyond the noise)"
    print(f"median on/off {vote['ratio']:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}), "
          f"noise {vote['noise']:.1%}; goal: the vote's cost within noise: {verdict}")
    print(f"signal to exit, {controller}, np=2: seconds from the kill (one step = "
          f"{r['step_seconds'] * 1e3:.1f} ms, the vote-on runs' median)")
    print(f"{'signal':<11}{'stopped after':>20}{'save':>7}{'stopped':>9}{'exit':>7}"
          f"{'budget':>8}{'margin':>8}{'horovodrun':>12}  ranks' status")
    for s in r["stops"]:
        statuses = " ".join(f"{rank}:{status}"
                            for rank, status in sorted(s["rank_statuses"].items()))
        print(f"{s['signal'] + ' ' + str(s['rank']):<11}{s['stopped_after']:>20}"
              f"{s['save_seconds']:>7.2f}{s['stopped_seconds']:>9.2f}{s['exit_seconds']:>7.2f}"
              f"{s['budget_seconds']:>8.2f}{s['margin_seconds']:>8.2f}"
              f"{s['horovodrun_status']:>12}  {statuses}")
    print(f"exit: worst {r['worst_exit_seconds']:.2f} s, median {r['median_exit_seconds']:.2f} s; "
          f"goal: at most one step + one save + {SLACK_SECONDS:g} s: "
          f"{'met' if r['goal_met'] else 'NOT met'}; every rank exited {EXIT_STATUS}: "
          f"{'yes' if r['all_ranks_preempted'] else 'NO'}")


def main(argv):
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        results = {controller: measure(controller, pathlib.Path(scratch, controller))
                   for controller in FLAGS.controllers}
    for controller, r in results.items():
        report(controller, r)
    output.write_text(json.dumps({"recipe": RECIPE, "epochs": FLAGS.epochs,
                                  "controllers": results}, indent=1))
    print(f"save: rank 0's checkpoint write; stopped: until rank 0 says the ranks stopped "
          f"(checkpoint written); exit: until horovodrun exits. JSON: {output}")


if __name__ == "__main__":
    app.run(main)
