"""The `hvdtrain` command: `hvdtrain train --recipe=NAME [flags]` trains
(`--dry_run`: checks the flags and stops); `hvdtrain evaluate
--model_dir=DIR [--checkpoint=NAME] [--split=NAME]` evaluates a run's model;
`hvdtrain check-config FILE` checks a horovodrun --config-file strictly;
`hvdtrain doctor [FILE]` reports what this machine gives a job; `hvdtrain
report RUN_DIR` plots a run's log.

Run it under `horovodrun -np N ...` for N workers, or plainly for one.
Under horovodrun's elastic mode (--min-np, --max-np, --host-discovery-script)
it trains on the workers there are, going on from the last commit when they
change.
Flags left unset take the recipe's defaults; `--flagfile=FILE` reads flags
from a file. Bad input ends every rank with one line on stderr and exit 2;
a run that cannot go on, exit 1; a run stopped by a signal after a
checkpoint (hvdtrain.faults.preemption), exit 200.
"""

import dataclasses
import os
import sys
import time
import typing

from absl import app, flags, logging

from hvdtrain import errors
from hvdtrain import recipe as recipe_lib
from hvdtrain.config import TrainConfig
from hvdtrain.errors import TrainingError, UsageError
from hvdtrain.faults import preemption
from hvdtrain.state import model_dir
from hvdtrain.tools import horovod_config

__all__ = ["SETTINGS", "run", "run_recipe"]

COMMANDS = ("train", "evaluate", "check-config", "doctor", "report")
# Seconds a rank that lost a peer waits before it exits (see _main).
_BYSTANDER_EXIT_DELAY_SECONDS = 5

# TrainConfig's settings; each is a flag of the same name. (Its `options`,
# the recipe's own settings, come from --option.)
SETTINGS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "options")
_DEFINE_BY_TYPE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
                   float: flags.DEFINE_float, str: flags.DEFINE_string}


def _define_setting_flags():
    """A flag per setting, of its field's type, with the help and choices
    the field declares. Unset, a flag is None, so the recipe's default
    applies; --recipe picks the recipe, so it has the field's default."""
    for field in dataclasses.fields(TrainConfig):
        if field.name not in SETTINGS:
            continue
        default = field.default if field.name == "recipe" else None
        help_text = field.metadata["help"]
        if "choices" in field.metadata:
            flags.DEFINE_enum(field.name, default, field.metadata["choices"], help_text)
        else:
            kind, = set(typing.get_args(field.type) or (field.type,)) - {type(None)}
            _DEFINE_BY_TYPE[kind](field.name, default, help_text)


_define_setting_flags()
flags.DEFINE_multi_string(
    "option", [], "The recipe's own setting, NAME=VALUE; repeat for several "
    "(--helpshort --recipe=NAME lists them).")
flags.DEFINE_bool(
    "self_test", True, "doctor: run the 2-process allreduce self-test under each controller.")
flags.DEFINE_bool(
    "dry_run", False, "Check the flags and the recipe's settings, print them, and stop before "
    "training.")
flags.DEFINE_string(
    "checkpoint", "", "evaluate: a checkpoint of the run (its name under "
    "--model_dir/checkpoints, or its path) instead of the exported model.")
flags.DEFINE_string(
    "split", "validation", "evaluate: the split to evaluate on: validation (what training "
    "validated on), or another the recipe names (e.g. train).")
flags.DEFINE_string(
    "output", "", "evaluate: the JSON file to write the metrics to (default: "
    "--model_dir/evaluation-SPLIT[-CHECKPOINT].json).")

FLAGS = flags.FLAGS


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
            raise UsageError(f"unexpected arguments {' '.join(rest)}; flags take the form "
                             "--name=value")
        if command == "evaluate":
            _evaluate()
            return
        _train()
    except UsageError as e:
        _fail(str(e))
    except TrainingError as e:
        _fail(str(e), status=1)
    except preemption.Preempted as e:
        sys.stderr.write(f"hvdtrain: {e}\n")
        logging.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        # At once: Python's finalization (TensorFlow's and Horovod's teardown)
        # takes a second or two, differently on each rank, and a launcher that
        # sees the first rank exit kills the rest, reporting a death by signal
        # for them. Left together at the checkpoint's barrier, the ranks exit
        # together. Everything is written: the checkpoint, logs, TensorBoard.
        os._exit(preemption.EXIT_STATUS)
    except Exception as e:
        reason = errors.lost_peer(e)
        if reason is None:
            _tell_others(f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0]}")
            raise
        # Another rank failed first and said why (or the launcher names it); this one
        # names it and stops, after the failing rank has had the time to exit: launchers
        # name the first process to exit as the job's failure.
        _fail(_departures().why_stopped(reason), status=1, delay=_BYSTANDER_EXIT_DELAY_SECONDS,
              tell_others=False)


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
    from hvdtrain.tools import doctor

    print(doctor.report(paths[0] if paths else None, self_test=FLAGS.self_test))


def _report(paths):
    if len(paths) != 1:
        raise UsageError("report takes one run directory: hvdtrain report runs/digits_cnn")
    from hvdtrain.tools import report

    print(f"hvdtrain: report written to {report.write(paths[0])}")


def _checked_config():
    """The run's settings from the flags, checked (see _train)."""
    # The recipe is make_config's own argument.
    values = {name: FLAGS[name].value for name in SETTINGS if name != "recipe"}
    # Bad input fails here, before TensorFlow loads: fast, and one line.
    recipe_lib.check_name(FLAGS.recipe)
    TrainConfig().override(**values).validate()
    model_dir.check_usable(FLAGS.model_dir or model_dir.DEFAULT_PARENT)
    horovod_config.warn_about_launch_config()
    # The recipe's options need its module (and so TensorFlow) to be checked.
    return recipe_lib.make_config(FLAGS.recipe, FLAGS.option, **values)


def _evaluate():
    config = _checked_config()
    from hvdtrain import runtime
    from hvdtrain.run import evaluator

    result = evaluator.evaluate(config, FLAGS.split, FLAGS.checkpoint or None,
                                FLAGS.output or None,
                                given=[name for name in SETTINGS if FLAGS[name].present])
    if runtime.is_main_process():
        print(f"hvdtrain: {evaluator.describe(result)}; written to {result.path}")


def _train():
    config = _checked_config()
    if FLAGS.dry_run:
        settings = " ".join(f"--{k}={v}" for k, v in dataclasses.asdict(config).items()
                            if v is not None and k != "options")
        options = "".join(f" --option={k}={v}" for k, v in config.options.items())
        print(f"hvdtrain: dry run: the flags are valid; training would use {settings}{options}")
        return

    from hvdtrain import runtime
    from hvdtrain.run import trainer
    from hvdtrain.tools import throughput

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


def _departures():
    """hvdtrain.faults.departures once a run has started (it loads
    TensorFlow), else None: before that no other rank waits for this one."""
    return sys.modules.get("hvdtrain.faults.departures")


def _tell_others(message):
    """The run's other ranks, waiting in a collective, learn that this one
    fails with `message` (faults/departures.py)."""
    if _departures() is not None:
        _departures().fail(message)


def _summary(config, result, workers):
    """What was trained, how long, and the last epoch's metrics (validation
    ones where there are)."""
    # The learning rate and the throughput have lines of their own.
    last = {k: v[-1] for k, v in result.history.items()
            if k not in ("learning_rate", "examples_per_second")}
    shown = {k: v for k, v in last.items() if k.startswith("val_")} or last
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items()))
    epochs = max(map(len, result.history.values()), default=0)
    stopped = " (stopped early)" if epochs < config.epochs - result.start[0] and epochs else ""
    return (f"{config.recipe} on {workers} worker{'s' * (workers != 1)}, {epochs} epoch"
            f"{'s' * (epochs != 1)}{stopped} in {result.seconds:.1f} s: "
            f"{metrics or 'already trained'}")


def _fail(message, status=2, delay=0, tell_others=True):
    if tell_others:
        _tell_others(message)
    # One write: launchers tag each write, and a separate newline would get a tag of its own.
    sys.stderr.write(f"hvdtrain: error: {message}\n")
    sys.stderr.flush()
    time.sleep(delay)
    sys.exit(status)
