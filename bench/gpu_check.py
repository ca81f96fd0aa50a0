"""The first run on a GPU node: is hvdtrain's GPU flavour working here, and
how fast is it? One command, one JSON file, under 10 minutes on one H200:

    HVDTRAIN_GPU=1 scripts/install.sh && source .venv/bin/activate
    python bench/gpu_check.py                 # -> runs/bench/gpu_check.json
    python bench/gpu_check.py --tiny          # any CPU, in a few minutes (CI)

It runs, in order:
  1. `hvdtrain doctor`: versions, the GPU stack (driver, CUDA, cuDNN, NCCL at
     build and run time) and the allreduce self-tests, NCCL's among them;
  2. bench/gpu_resnet50.py: ResNet-50 at float32, mixed_float16 and
     mixed_bfloat16, hvdtrain against plain Keras, and with XLA
     (--jit_compile) against without, on one GPU;
  3. the demo (`make demo`'s job) at np = the GPUs of this node;
  4. wide_and_deep with its tables sharded across those GPUs
     (--option=embeddings=sharded: lookups by NCCL's alltoall), small;
  5. the gpt recipe with --tensor_parallel=2 over those GPUs (NCCL's
     allreduces inside every layer), with its tokens/s and model FLOPs
     utilisation; skipped on a node of one GPU;
  6. the gpt recipe cut into --pipeline_parallel=2 stages (NCCL's send and
     receive between them, through Horovod's alltoall), with
     --tensor_parallel=2 inside each stage on a node of 4 GPUs or more;
     skipped on a node of one GPU.
Each step's verdict is in the JSON; the exit status is 0 only if all passed.
"""

import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parents[1]

flags.DEFINE_bool("tiny", False, "Sizes for a CPU in minutes (CI), not for a GPU.")
flags.DEFINE_string("output", "runs/bench/gpu_check.json", "The results file.")
FLAGS = flags.FLAGS

# gpu_resnet50.py's settings: a full check keeps its GPU sizes with fewer
# windows, so that its nine runs, three with XLA's compiling, fit in about ten
# minutes (an estimate: no GPU has run it yet).
RESNET_FULL = ["--windows=4"]
RESNET_TINY = ["--image_size=32", "--num_classes=10", "--batch_size=2", "--warmup_steps=1",
               "--window_steps=2", "--windows=2", "--precisions=float32,mixed_bfloat16"]
DEMO_ACCURACY = 0.95   # make demo's bar (tests/parallel/test_demo.py)
# tests/ranked/test_wide_and_deep.py's synthetic settings and bar.
SHARDED = ["--recipe=wide_and_deep", "--option=embeddings=sharded", "--option=table_rows=8192",
           "--option=embedding_dim=8", "--option=hidden_units=64,32", "--batch_size=128",
           "--option=synthetic_examples=16000", "--epochs=2", "--optimizer=sgd", "--momentum=0",
           "--learning_rate=0.3"]
SHARDED_AUC = 0.65
# The gpt recipe's bar (tests/ranked/test_tensor_parallel.py): the validation
# loss this share of the way from the achievable loss to the unigram baseline.
GPT_TINY = ["--epochs=1", "--option=train_sequences=1024"]
GPT_SHARE = 0.3


def check_doctor():
    from hvdtrain.tools import doctor
    report = {title: dict(rows) for title, rows in doctor.sections(REPO / "horovodrun.cfg")}
    self_tests = {**report["allreduce self-test, 2 local processes"],
                  **report["NCCL self-test, one process per GPU"]}
    failed = [name for name, verdict in self_tests.items()
              if not verdict.startswith(("correct", "skipped"))]
    problems = [f"{name} self-test: {self_tests[name]}" for name in failed]
    stack = report["GPU stack"]
    if not stack["NCCL operations"].startswith("built"):
        problems.append(f"NCCL operations {stack['NCCL operations']}")
    if "problem" in stack:
        problems.append(stack["problem"])
    return dict(ok=not problems, problems=problems, report=report)


def check_resnet50(output):
    sizes = RESNET_TINY if FLAGS.tiny else RESNET_FULL
    result = subprocess.run([sys.executable, REPO / "bench" / "gpu_resnet50.py", *sizes,
                             f"--output={output}"], cwd=REPO, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        return dict(ok=False, problems=[_last_line(result)])
    return dict(ok=True, problems=[], **json.loads(pathlib.Path(output).read_text()))


def check_demo(workers, model_dir):
    epochs = ["--epochs=2"] if FLAGS.tiny else []
    found, result = _train(workers, ["--recipe=digits_cnn", f"--model_dir={model_dir}", *epochs])
    accuracy = re.search(r"val_accuracy (\d\.\d+)", result.stdout)
    found["val_accuracy"] = accuracy and float(accuracy.group(1))
    problems = []
    if result.returncode != 0 or accuracy is None:
        problems.append(_last_line(result))
    elif not FLAGS.tiny and found["val_accuracy"] < DEMO_ACCURACY:
        problems.append(f"val_accuracy {found['val_accuracy']} < {DEMO_ACCURACY}")
    return dict(ok=not problems, problems=problems, **found)


def check_sharded(workers, model_dir):
    found, result = _train(workers, [*SHARDED, f"--model_dir={model_dir}"])
    auc = re.search(r"val_auc (\d\.\d+)", result.stdout)
    found["val_auc"] = auc and float(auc.group(1))
    problems = []
    if result.returncode != 0 or auc is None:
        problems.append(_last_line(result))
    elif found["val_auc"] < SHARDED_AUC:
        problems.append(f"val_auc {found['val_auc']} < {SHARDED_AUC}")
    return dict(ok=not problems, problems=problems, **found)


def check_tensor_parallel(workers, model_dir):
    return _check_gpt(workers, model_dir, ["--tensor_parallel=2"])


def check_pipeline(workers, model_dir):
    split = ["--tensor_parallel=2"] if workers >= 4 else []
    return _check_gpt(workers, model_dir, ["--pipeline_parallel=2", *split])


def _check_gpt(workers, model_dir, layout):
    """The gpt recipe in `layout` (flags) learns: its validation loss, its
    rate and model FLOPs utilisation."""
    if workers < 2:
        return dict(ok=True, problems=[], skipped="one GPU: no replica of 2 ranks")
    sizes = GPT_TINY if FLAGS.tiny else []
    found, result = _train(workers, ["--recipe=gpt", *layout, f"--model_dir={model_dir}",
                                     *sizes])
    loss = re.search(r"val_loss (\d+\.\d+)", result.stdout)
    bounds = re.search(r"unigram baseline (\d+\.\d+), achievable (\d+\.\d+)", result.stderr)
    utilisation = re.search(r"throughput: ([\d,]+ tokens/s.*)", result.stderr)
    found.update(val_loss=loss and float(loss.group(1)),
                 model_flops=utilisation and utilisation.group(1))
    problems = []
    if result.returncode != 0 or loss is None or bounds is None:
        problems.append(_last_line(result))
    else:
        unigram, achievable = map(float, bounds.groups())
        bar = unigram if FLAGS.tiny else achievable + GPT_SHARE * (unigram - achievable)
        if found["val_loss"] >= bar:
            problems.append(f"val_loss {found['val_loss']} >= {bar:.3f}")
    return dict(ok=not problems, problems=problems, **found)


def _train(workers, args):
    """({workers, command, per_second, unit}, the run) of `hvdtrain train`
    with `args` at np=`workers`."""
    command = ["horovodrun", "--config-file", "horovodrun.cfg", "-np", str(workers),
               "-H", f"localhost:{workers}", "hvdtrain", "train", *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    # Absent when a run is too short to leave warm-up (--tiny).
    rate = re.search(r"hvdtrain: throughput (\S+) (\w+)/s", result.stdout)
    return dict(workers=workers, command=" ".join(command),
                per_second=rate and float(rate.group(1)), unit=rate and rate.group(2)), result


def _last_line(result):
    lines = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()
    return f"exit {result.returncode}: {lines[-1][:300]}"


def main(argv):
    import tensorflow as tf
    start = time.perf_counter()
    gpus = len(tf.config.list_physical_devices("GPU"))
    results = dict(gpus=gpus, tiny=FLAGS.tiny)
    with tempfile.TemporaryDirectory() as scratch:
        steps = [("doctor", check_doctor),
                 ("resnet50", lambda: check_resnet50(pathlib.Path(scratch) / "resnet50.json")),
                 # One process per GPU; two on a machine without one.
                 ("demo", lambda: check_demo(gpus or 2, pathlib.Path(scratch) / "demo")),
                 ("sharded", lambda: check_sharded(gpus or 2, pathlib.Path(scratch) / "sharded")),
                 ("tensor", lambda: check_tensor_parallel(gpus or 2,
                                                          pathlib.Path(scratch) / "tensor")),
                 ("pipeline", lambda: check_pipeline(gpus or 2,
                                                     pathlib.Path(scratch) / "pipeline"))]
        for name, step in steps:
            began = time.perf_counter()
            results[name] = step()
            results[name]["seconds"] = round(time.perf_counter() - began, 1)
            verdict = "ok" if results[name]["ok"] else "FAILED: " + "; ".join(
                results[name]["problems"])
            print(f"gpu_check: {name:<9} {verdict} ({results[name]['seconds']:.0f} s)", flush=True)
    results["seconds"] = round(time.perf_counter() - start, 1)
    results["ok"] = all(results[name]["ok"] for name, _ in steps)
    output = REPO / FLAGS.output
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"gpu_check: {'passed' if results['ok'] else 'FAILED'} in {results['seconds']:.0f} s "
          f"on {gpus} GPU{'s' * (gpus != 1)}; results in {output}")
    sys.exit(0 if results["ok"] else 1)


if __name__ == "__main__":
    app.run(main)
