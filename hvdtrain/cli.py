"""The `hvdtrain` command: `hvdtrain train --recipe=NAME [flags]` trains
(`--dry_run`: checks the flags and stops); `hvdtrain check-config FILE`
checks a horovodrun --config-file strictly; `hvdtrain doctor [FILE]`
reports what this machine gives a job; `hvdtrain report RUN_DIR` plots a
run's log.

Run it under `horovodrun -np N ...` for N workers, or plainly for one.
Under horovodrun's elastic mode (--min-np, --max-np, --host-discovery-script)
it trains on the workers there are, going on from the last commit when they
change.
Flags left unset take the recipe's defaults; `--flagfile=FILE` reads flags
from a file. Bad input ends every rank with one line on stderr and exit 2.
"""

import dataclasses
import sys

from absl import app, flags

from hvdtrain import horovod_config, model_dir
from hvdtrain import recipe as recipe_lib
from hvdtrain.config import (COMPRESSIONS, LR_SCHEDULES, NAN_POLICIES, OPTIMIZERS, PRECISIONS,
                             TrainConfig)
from hvdtrain import errors
from hvdtrain.errors import TrainingError, UsageError

COMMANDS = ("train", "check-config", "doctor", "report")

flags.DEFINE_string("recipe", "digits_cnn", "Recipe to train: a module of recipes/.")
flags.DEFINE_integer("epochs", None, "Epochs to train.")
flags.DEFINE_integer("batch_size", None, "Batch size per worker (global: workers x this).")
flags.DEFINE_float("learning_rate", None, "One worker's learning rate; scaled by the number of workers.")
flags.DEFINE_float("warmup_epochs", None, "Epochs of linear warm-up to the scaled learning rate.")
flags.DEFINE_enum("lr_schedule", None, LR_SCHEDULES, "After warm-up: constant, cosine decay to 0 at the end, or step (x0.1 at 1/2 and 3/4 of the epochs).")
flags.DEFINE_enum("optimizer", None, OPTIMIZERS, "Optimizer.")
flags.DEFINE_float("momentum", None, "Momentum (sgd).")
flags.DEFINE_integer("seed", None, "Random seed for weights and shuffling.")
flags.DEFINE_string("data_dir", None, "TFDS data directory (default: TFDS's, ~/tensorflow_datasets).")
flags.DEFINE_bool("deterministic", None, "Reproducible input order (tf.data's parallel stages keep order).")
flags.DEFINE_enum("precision", None, PRECISIONS, "Keras dtype policy (mixed_float16 adds loss scaling).")
flags.DEFINE_enum("compression", None, COMPRESSIONS, "Compression of the gradients on the wire.")
flags.DEFINE_integer("backward_passes_per_step", None, "Batches whose gradients accumulate locally per allreduce and update.")
flags.DEFINE_bool("sparse_as_dense", None, "Reduce embedding gradients densely instead of allgathering them.")
flags.DEFINE_integer("allreduce_groups", None, "0: each gradient's allreduce starts as soon as it is computed (Horovod fuses those ready together); N: the gradients in N groups, each reduced as one when all of it is ready (fewer collectives; try 1 on CPUs).")
flags.DEFINE_string("model_dir", None, "Where rank 0 writes checkpoints and the model (default runs/<recipe>).")
flags.DEFINE_bool("resume", None, "Go on from the newest intact checkpoint in --model_dir (if any).")
flags.DEFINE_integer("checkpoint_epochs", None, "A checkpoint every this many epochs (0: only after the last).")
flags.DEFINE_integer("checkpoint_steps", None, "Also a checkpoint every this many training steps (0: none within epochs).")
flags.DEFINE_integer("keep_checkpoints", None, "Checkpoints kept: the newest this many, plus the best by --best_metric (0: write none).")
flags.DEFINE_string("best_metric", None, "Metric whose best checkpoint is kept (e.g. val_accuracy; empty: none).")
flags.DEFINE_enum("nan_policy", None, NAN_POLICIES, "fail: stop every rank when the loss is NaN or infinite; ignore: train on.")
flags.DEFINE_integer("elastic_commit_steps", None, "Under horovodrun's elastic mode: commit the training state every this many steps (and at each epoch's end); a lost worker costs the steps since the last commit, and added hosts join at the next one.")
flags.DEFINE_float("stall_timeout", None, "Seconds a rank waits for a hung peer before Horovod's stall check stops the job; hvdtrain's watchdog, over the whole run and under any controller, names the hung rank and stops the job after 3 times that; 0: never.")
flags.DEFINE_integer("intra_op_threads", None, "Threads per op in each process (0: cores / local processes).")
flags.DEFINE_integer("inter_op_threads", None, "Threads for independent ops (0: TensorFlow's default).")
flags.DEFINE_bool("export", None, "Rank 0 writes the trained model (.keras and SavedModel) to --model_dir.")
flags.DEFINE_integer("throughput_warmup_steps", None, "Training steps at the start of each fit left out of the throughput.")
flags.DEFINE_integer("throughput_window_steps", None, "Training steps per throughput sample (the report: mean and 95% interval over samples).")
flags.DEFINE_multi_string("option", [], "The recipe's own setting, NAME=VALUE; repeat for several (--helpshort --recipe=NAME lists them).")
flags.DEFINE_string("timeline_steps", None, "FIRST:LAST: record Horovod's timeline of those global training steps into --model_dir/timeline.json (chrome://tracing, ui.perfetto.dev).")
flags.DEFINE_bool("verbose_all_ranks", None, "Every rank shows its progress and logs, not only rank 0.")
flags.DEFINE_bool("self_test", True, "doctor: run the 2-process allreduce self-test under each controller.")
flags.DEFINE_bool("dry_run", False, "Check the flags and the recipe's settings, print them, and stop before training.")
flags.DEFINE_integer("verbose", None, "Progress on rank 0: 0 none, 1 bar, 2 line per epoch (default: a bar for one process on a terminal, else 2).")

FLAGS = flags.FLAGS
_CONFIG_FLAGS = ("epochs", "batch_size", "learning_rate", "warmup_epochs", "optimizer",
                 "momentum", "seed", "data_dir", "deterministic", "precision", "compression", "backward_passes_per_step",
                 "sparse_as_dense", "allreduce_groups", "model_dir", "resume", "checkpoint_epochs",
                 "checkpoint_steps", "keep_checkpoints", "best_metric", "nan_policy",
                 "elastic_commit_steps", "stall_timeout", "lr_schedule", "export",
                 "throughput_warmup_steps", "throughput_window_steps", "timeline_steps",
                 "verbose_all_ranks",
                 "intra_op_threads", "inter_op_threads", "verbose")


def run(argv=None):
    """The console script's entry point."""
    app.run(_main, argv=argv, flags_parser=_parse_flags)


def run_recipe(name):
    """Entry point of a recipe script: `python recipes/NAME.py [flags]`."""
    run([sys.argv[0], "train", f"--recipe={name}", *sys.argv[1:]])


def _parse_flags(argv):
    if {"-h", "--help", "--helpshort"} & set(argv[1:]):
        # absl's short help lists the flags of the script's own module, which
        # for a console script is not this one.
        print(f"usage: hvdtrain train [flags]\n\n{FLAGS.module_help(__name__).strip()}")
        _print_recipe_options(argv)
        sys.exit(0)
    try:
        return FLAGS(argv)
    except flags.CantOpenFlagFileError as e:
        _fail(f"{str(e).removeprefix('ERROR:: ')}; check the --flagfile path")
    except flags.Error as e:
        _fail(f"{e} (see --helpshort)")


def _print_recipe_options(argv):
    names = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--recipe=")]
    try:
        recipe = recipe_lib.get(names[-1] if names else FLAGS["recipe"].default)
    except UsageError as e:
        _fail(str(e))
    print(f"\nOptions of recipe {recipe.name} (--option=NAME=VALUE):")
    print(recipe_lib.describe_options(recipe) or "  none")


def _main(argv):
    try:
        command, *rest = argv[1:] or [""]
        if command not in COMMANDS:
            raise UsageError(f"unknown command '{command}'; use one of: {', '.join(COMMANDS)} "
                             "(e.g. hvdtrain train --recipe=digits_cnn)")
        if command == "check-config":
            _check_config(rest)
            return
        if command == "doctor":
            _doctor(rest)
            return
        if command == "report":
            _report(rest)
            return
        if rest:
            raise UsageError(f"unexpected arguments {' '.join(rest)}; flags take the form --name=value")
        _train()
    except UsageError as e:
        _fail(str(e))
    except TrainingError as e:
        _fail(str(e), status=1)
    except Exception as e:
        reason = errors.lost_peer(e)
        if reason is None:
            raise
        # Another rank failed first and said why (or the launcher names it); this one just stops.
        _fail(f"stopped because another worker failed or stopped responding ({reason}); "
              "see its error or the launcher's report", status=1)


def _check_config(paths):
    if len(paths) != 1:
        raise UsageError("check-config takes one file: hvdtrain check-config horovodrun.cfg")
    config = horovod_config.check(paths[0])
    settings = sum(len(v) if isinstance(v, dict) else v is not None for v in config.values())
    print(f"hvdtrain: {paths[0]} is valid for horovodrun --config-file "
          f"({settings} settings in {len(config)} sections)")


def _doctor(paths):
    if len(paths) > 1:
        raise UsageError("doctor takes at most one file: hvdtrain doctor [horovodrun.cfg]")
    from hvdtrain import doctor

    print(doctor.report(paths[0] if paths else None, self_test=FLAGS.self_test))


def _report(paths):
    if len(paths) != 1:
        raise UsageError("report takes one run directory: hvdtrain report runs/digits_cnn")
    from hvdtrain import report

    print(f"hvdtrain: report written to {report.write(paths[0])}")


def _train():
    values = {name: FLAGS[name].value for name in _CONFIG_FLAGS}
    # Bad input fails here, before TensorFlow loads: fast, and one line.
    recipe_lib.check_name(FLAGS.recipe)
    TrainConfig().override(**values).validate()
    model_dir.check_usable(FLAGS.model_dir or model_dir.DEFAULT_PARENT)
    horovod_config.warn_about_launch_config()
    # The recipe's options need its module (and so TensorFlow) to be checked.
    config = recipe_lib.make_config(FLAGS.recipe, FLAGS.option, **values)
    if FLAGS.dry_run:
        settings = " ".join(f"--{k}={v}" for k, v in dataclasses.asdict(config).items()
                            if v is not None and k != "options")
        options = "".join(f" --option={k}={v}" for k, v in config.options.items())
        print(f"hvdtrain: dry run: the flags are valid; training would use {settings}{options}")
        return

    from hvdtrain import runtime, throughput, trainer

    result = trainer.train(config)
    if runtime.is_main_process():
        print(f"hvdtrain: {_summary(config, result, runtime.size())}")
        if result.throughput is not None:
            unit = recipe_lib.get(config.recipe).unit
            print(f"hvdtrain: throughput {throughput.describe(result.throughput, unit)}")
        else:
            print(f"hvdtrain: throughput not measured: too few steps (a sample is "
                  f"{config.throughput_window_steps} steps inside one epoch, after the first "
                  f"{config.throughput_warmup_steps} of training; see --throughput_window_steps "
                  "and --throughput_warmup_steps)")
        if config.export:
            print(f"hvdtrain: model written to {result.model_path} and {result.saved_model}")


def _summary(config, result, workers):
    """What was trained, how long, and the last epoch's metrics (validation
    ones where there are)."""
    # The learning rate and the throughput have lines of their own.
    last = {k: v[-1] for k, v in result.history.items()
            if k not in ("learning_rate", "examples_per_second")}
    shown = {k: v for k, v in last.items() if k.startswith("val_")} or last
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items()))
    epochs = config.epochs - result.start[0]
    return (f"{config.recipe} on {workers} worker{'s' * (workers != 1)}, {epochs} epoch{'s' * (epochs != 1)} in "
            f"{result.seconds:.1f} s: {metrics or 'already trained'}")


def _fail(message, status=2):
    # One write: launchers tag each write, and a separate newline would get a tag of its own.
    sys.stderr.write(f"hvdtrain: error: {message}\n")
    sys.stderr.flush()
    sys.exit(status)
