"""horovodrun's `--config-file`, checked strictly.

horovodrun reads a YAML file of sections (params, autotune, timeline,
stall_check, library_options, logging) and quietly ignores any key it does
not know, so a misspelt `fusion_treshold_mb` silently does nothing. `check()`
knows every key horovodrun 0.28.1 reads (horovod/runner/common/util/
config_parser.py) with its type and range, and names the first mistake.
"""

import dataclasses
import math
import pathlib

import yaml

from hvdtrain.errors import UsageError

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


@dataclasses.dataclass(frozen=True)
class Value:
    kind: type                  # bool, int, float (an int is a float too) or str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()

    def problem(self, value):
        """What is wrong with `value`, or None."""
        accepted = (int, float) if self.kind is float else self.kind
        if isinstance(value, bool) != (self.kind is bool) or not isinstance(value, accepted):
            return f"must be {_KIND_NAMES[self.kind]}, got {value!r}"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be finite, got {value!r}"
        if self.low is not None and value < self.low:
            return f"must be >= {self.low:g}, got {value!r}"
        if self.high is not None and value > self.high:
            return f"must be <= {self.high:g}, got {value!r}"
        return None


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_COUNT = Value(int, low=0)
_SECONDS = Value(int, low=0)

SCHEMA = {
    "controller": Value(str, choices=("gloo", "mpi")),
    "params": {
        "fusion_threshold_mb": _COUNT,
        "cycle_time_ms": Value(float, low=0),
        "cache_capacity": _COUNT,
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
        "num_nccl_streams": Value(int, low=1),
        "thread_affinity": _COUNT,
        "gloo_timeout_seconds": Value(int, low=1),
    },
    "logging": {
        "level": Value(str, choices=LOG_LEVELS),
        "with_timestamp": Value(bool),
    },
}


def check(path):
    """Returns the config at `path` as a dict, or raises a UsageError naming
    the first unknown key or bad value and how to fix it."""
    path = pathlib.Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}; check the path") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{path} is not valid YAML{where}; fix its syntax") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} must hold sections (params:, stall_check:, ...), "
                         f"not {type(config).__name__}")
    _check_mapping(path, config, SCHEMA, prefix="")
    _check_consistency(path, config)
    return config


def _check_mapping(path, mapping, schema, prefix):
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if key not in schema:
            raise UsageError(f"{path}: unknown key '{name}' (horovodrun would ignore it); "
                             f"known here: {', '.join(schema)}")
        expected = schema[key]
        if isinstance(expected, dict):
            if not isinstance(value, dict):
                raise UsageError(f"{path}: '{name}' must be a section of keys "
                                 f"({', '.join(expected)}), got {value!r}")
            _check_mapping(path, value, expected, prefix=f"{name}.")
        elif (problem := expected.problem(value)) is not None:
            raise UsageError(f"{path}: '{name}' {problem}")


def _check_consistency(path, config):
    stall = config.get("stall_check") or {}
    warning = stall.get("warning_time_seconds", 60)
    shutdown = stall.get("shutdown_time_seconds", 0)
    if 0 < shutdown < warning:
        raise UsageError(f"{path}: 'stall_check.shutdown_time_seconds' ({shutdown}) is below "
                         f"'warning_time_seconds' ({warning}), so Horovod would never shut "
                         "down; make it at least the warning time")
