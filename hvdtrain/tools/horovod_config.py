"""horovodrun's `--config-file`, checked strictly.

horovodrun reads a YAML file of sections (params, autotune, timeline,
stall_check, library_options, logging) and quietly ignores any key it does
not know, so a misspelt `fusion_treshold_mb` silently does nothing, while a
value of the wrong type ends horovodrun with a traceback. `check()` knows
every key horovodrun 0.28.1 reads (horovod/runner/common/util/
config_parser.py) with its type and range, and names the first mistake.
`warn_about_launch_config()` checks, from a worker, the file its horovodrun
was given.
"""

import argparse
import collections.abc
import dataclasses
import difflib
import math
import os
import pathlib
import sys

import yaml

from hvdtrain.errors import UsageError

__all__ = ["SCHEMA", "check", "warn_about_launch_config"]

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


@dataclasses.dataclass(frozen=True)
class Value:
    kind: type                  # bool, int, float (an int is a float too) or str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    any_case: bool = False      # horovodrun lower-cases the value before comparing

    def problem(self, value):
        """What is wrong with `value`, or None."""
        accepted = (int, float) if self.kind is float else self.kind
        if isinstance(value, bool) != (self.kind is bool) or not isinstance(value, accepted):
            return f"must be {_KIND_NAMES[self.kind]}, got {value!r}"
        if self.choices and (value.lower() if self.any_case else value) not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be finite, got {value!r}"
        if self.low is not None and value < self.low:
            return f"must be >= {self.low}, got {value!r}"
        if self.high is not None and value > self.high:
            return f"must be <= {self.high}, got {value!r}"
        return None


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
# Horovod reads most of these into a C int; a larger value would wrap around.
_INT_MAX = 2**31 - 1
_COUNT = Value(int, low=0, high=_INT_MAX)
_SECONDS = Value(int, low=0, high=_INT_MAX)

SCHEMA = {
    "controller": Value(str, choices=("gloo", "mpi"), any_case=True),
    "params": {
        # horovodrun passes bytes (MB x 2**20), which Horovod reads into an int64.
        "fusion_threshold_mb": Value(int, low=0, high=(2**63 - 1) >> 20),
        "cycle_time_ms": Value(float, low=0),
        "cache_capacity": Value(int, low=0, high=2**32 - 1),   # a uint32
        "hierarchical_allreduce": Value(bool),
        "hierarchical_allgather": Value(bool),
        "torus_allreduce": Value(bool),
    },
    "autotune": {
        "enabled": Value(bool),
        "log_file": Value(str),
        "warmup_samples": _COUNT,
        "steps_per_sample": _COUNT,
        "bayes_opt_max_samples": _COUNT,
        "gaussian_process_noise": Value(float, low=0, high=1),
    },
    "timeline": {
        "filename": Value(str),
        "mark_cycles": Value(bool),
    },
    "stall_check": {
        "enabled": Value(bool),
        "warning_time_seconds": _SECONDS,
        "shutdown_time_seconds": _SECONDS,
    },
    "library_options": {
        "mpi_threads_disable": Value(bool),
        "num_nccl_streams": Value(int, low=1, high=_INT_MAX),
        "thread_affinity": _COUNT,
        "gloo_timeout_seconds": Value(int, low=1, high=_INT_MAX),
    },
    "logging": {
        # horovodrun hands the level to Python's logging, which knows only upper case.
        "level": Value(str, choices=LOG_LEVELS),
        "with_timestamp": Value(bool),
    },
}


def check(path):
    """Returns the config at `path` as a dict, or raises a UsageError naming
    the first unknown key or bad value and how to fix it."""
    path = pathlib.Path(path)
    try:
        config = yaml.load(path.read_text(), Loader=_StrictLoader)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}; check the path") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a text file; horovodrun's --config-file is YAML "
                         "text") from None
    except _DuplicateKey as e:
        raise UsageError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{path} is not valid YAML{where}; fix its syntax") from None
    if config is None:
        raise UsageError(f"{path} is empty, which horovodrun cannot read; give it sections "
                         "(params:, stall_check:, ...) or launch without --config-file")
    if not isinstance(config, dict):
        raise UsageError(f"{path} must hold sections (params:, stall_check:, ...), "
                         f"not {type(config).__name__}")
    _check_mapping(path, config, SCHEMA, prefix="")
    _check_consistency(path, config)
    return config


class _DuplicateKey(yaml.YAMLError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML
    keeps the last silently, so a second `params:` would drop the first."""

    def construct_mapping(self, node, deep=False):
        lines = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, collections.abc.Hashable):
                continue            # the safe loader's own error names it
            if key in lines:
                raise _DuplicateKey(f"'{key}' is given twice (lines {lines[key]} and {line}) and "
                                    "YAML keeps only the last; merge the two")
            lines[key] = line
        return super().construct_mapping(node, deep)


def _check_mapping(path, mapping, schema, prefix):
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if key not in schema:
            raise UsageError(f"{path}: {_unknown(key, value, schema, prefix)}")
        expected = schema[key]
        if isinstance(expected, dict):
            if value is None:       # a section whose keys are all commented out
                continue
            if not isinstance(value, dict):
                raise UsageError(f"{path}: '{name}' must be a section of keys "
                                 f"({', '.join(expected)}), got {value!r}")
            _check_mapping(path, value, expected, prefix=f"{name}.")
        elif (problem := expected.problem(value)) is not None:
            raise UsageError(f"{path}: '{name}' {problem}")


def _unknown(key, value, schema, prefix):
    """`key` is not in `schema`: which key was probably meant."""
    what = "section" if not prefix and (value is None or isinstance(value, dict)) else "key"
    close = difflib.get_close_matches(str(key), list(schema), n=1)
    hint = (f"did you mean '{prefix}{close[0]}'?" if close else
            f"known {f'in {prefix[:-1]}' if prefix else 'at the top level'}: {', '.join(schema)}")
    return f"unknown {what} '{prefix}{key}', which horovodrun ignores; {hint}"


def _check_consistency(path, config):
    timeline = config.get("timeline") or {}
    if timeline.get("mark_cycles") and not timeline.get("filename"):
        raise UsageError(f"{path}: 'timeline.mark_cycles' does nothing without "
                         "'timeline.filename' (horovodrun records no timeline then); "
                         "add the file name, or remove mark_cycles")
    stall = config.get("stall_check") or {}
    warning = stall.get("warning_time_seconds", 60)
    shutdown = stall.get("shutdown_time_seconds", 0)
    if 0 < shutdown < warning:
        raise UsageError(f"{path}: 'stall_check.shutdown_time_seconds' ({shutdown}) is below "
                         f"'warning_time_seconds' ({warning}), so Horovod would never shut "
                         "down; make it at least the warning time")


def warn_about_launch_config():
    """Checks the --config-file this worker's horovodrun was given and, on
    one process, warns in one line: the job has started, so a mistake there
    is no longer an error, but it went unnoticed (horovodrun ignores unknown
    keys and passes on values of the wrong type)."""
    # One process per job finds horovodrun among its ancestors (those on the
    # launching host); the first of them warns.
    if os.environ.get("HOROVOD_LOCAL_RANK", "0") != "0":
        return
    path = launch_config_file()
    if path is None:
        return
    try:
        check(path)
    except UsageError as e:
        # One write: launchers tag each write, and a separate newline would get a tag of its own.
        sys.stderr.write(f"hvdtrain: warning: {e} (this run goes on as horovodrun read the file; "
                         "fix it for the next launch)\n")
        sys.stderr.flush()


def launch_config_file():
    """The --config-file of the horovodrun that started this process, made
    absolute; None without one, or where horovodrun cannot be seen.

    horovodrun's command line is visible only on the host it runs on, and
    only under Gloo: workers on other hosts run under ssh, and with --mpi
    horovodrun replaces itself with mpirun, whose command line no longer
    names the file. There the launch itself must check it first."""
    import psutil  # a Horovod requirement

    for process in psutil.Process().parents():
        try:
            argv = process.cmdline()
            if any(os.path.basename(word) == "horovodrun" for word in argv[:2]):
                given = _config_file_option(argv)
                return None if given is None else pathlib.Path(process.cwd(), given)
        except psutil.Error:    # gone, or another user's: not this job's horovodrun
            continue
    return None


def _config_file_option(argv):
    """The --config-file in horovodrun's command line `argv`, or None."""
    # Only horovodrun's own options, not the command it runs (whose arguments
    # are this process's), may name it.
    worker_args = sys.argv[1:]
    if worker_args and argv[-len(worker_args):] == worker_args:
        argv = argv[:-len(worker_args)]
    try:
        return _CONFIG_FILE_OPTION.parse_known_args(argv)[0].config_file
    except argparse.ArgumentError:      # the option without a value, which horovodrun refuses
        return None


# horovodrun's own option (argparse, so its abbreviations like --config work too).
_CONFIG_FILE_OPTION = argparse.ArgumentParser(add_help=False, exit_on_error=False)
_CONFIG_FILE_OPTION.add_argument("--config-file")
