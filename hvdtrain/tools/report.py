"""`hvdtrain report RUN_DIR`: the run's curves as one PNG, from its JSON-lines log.

Panels: the losses (training and validation), the other metrics, the
throughput of each epoch (total, with its 95% interval) and the learning
rate. A resumed run's log repeats epochs; the last record of each counts.
"""

import json
import math
import pathlib

from hvdtrain.errors import UsageError
from hvdtrain.tools import run_log

__all__ = ["FILE", "epochs", "write"]

FILE = "report.png"


def epochs(records):
    """{epoch: its last `epoch` record}, in epoch order."""
    latest = {r["epoch"]: r for r in records if r.get("event") == "epoch"}
    return dict(sorted(latest.items()))


def write(run_dir):
    """Plots `run_dir`'s log into run_dir/report.png; returns its path."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot, ticker

    run_dir = pathlib.Path(run_dir)
    try:
        records = run_log.read(run_dir)
    except FileNotFoundError:
        raise UsageError(f"no {run_log.FILE} in {run_dir}; hvdtrain train writes it into its "
                         "--model_dir: pass that directory") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{run_dir / run_log.FILE} is not JSON lines ({e}); was it "
                         "written by hvdtrain train?") from None
    by_epoch = epochs(records)
    if not by_epoch:
        raise UsageError(f"{run_dir / run_log.FILE} has no finished epoch yet; "
                         "report again after the first one")
    numbers = list(by_epoch)
    metrics = [r["metrics"] for r in by_epoch.values()]
    names = sorted({k for m in metrics for k in m})
    losses = [n for n in names if n.endswith("loss")]
    others = [n for n in names if n not in losses and n != "learning_rate"]

    figure, ((loss, other), (speed, rate)) = pyplot.subplots(2, 2, figsize=(11, 7.5))
    for axes, shown, title in ((loss, losses, "loss"), (other, others, "metrics")):
        for name in shown:
            axes.plot(numbers, _series(metrics, name), marker=".", label=name)
        axes.set_title(title)
        if shown:
            axes.legend()
    timed = [(e, r["throughput"]["total"]) for e, r in by_epoch.items() if r.get("throughput")]
    if timed:
        means = [t["mean"] for _, t in timed]
        errors = [[t["mean"] - (t["low"] if t["low"] is not None else t["mean"]) for _, t in timed],
                  [(t["high"] if t["high"] is not None else t["mean"]) - t["mean"]
                   for _, t in timed]]
        speed.errorbar([e for e, _ in timed], means, yerr=errors, marker="o", capsize=3)
        speed.set_ylim(bottom=0)
    speed.set_title("throughput, all workers (examples/s, 95% interval)")
    rate.plot(numbers, _series(metrics, "learning_rate"), marker=".")
    rate.set_title("learning rate")
    for axes in (loss, other, speed, rate):
        axes.set_xlabel("epoch")
        axes.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
    start = next((r for r in reversed(records) if r.get("event") == "start"), {})
    figure.suptitle(f"{start.get('config', {}).get('recipe', run_dir.name)} on "
                    f"{start.get('workers', '?')} workers: {run_dir}")
    figure.tight_layout()
    path = run_dir / FILE
    try:
        figure.savefig(path, dpi=100)
    except OSError as e:
        raise UsageError(f"cannot write {path} ({e.strerror}); report on a copy of "
                         f"{run_dir} in a directory you can write to") from None
    finally:
        pyplot.close(figure)
    return path


def _series(metrics, name):
    """The metric's value in each epoch; NaN (a gap) where it is missing."""
    return [m.get(name, math.nan) for m in metrics]
