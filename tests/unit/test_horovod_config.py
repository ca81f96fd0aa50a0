"""`hvdtrain check-config`: horovodrun's --config-file checked strictly."""

import argparse

import pytest
import yaml

from hvdtrain.errors import UsageError
from hvdtrain.tools import horovod_config
from launch import REPO, run

CONFIG = REPO / "horovodrun.cfg"


def test_the_repositorys_config_is_valid_and_sets_what_its_comments_say():
    config = horovod_config.check(CONFIG)
    assert config["params"]["fusion_threshold_mb"] == 64
    assert config["stall_check"] == dict(enabled=True, warning_time_seconds=60,
                                         shutdown_time_seconds=600)


def _write(tmp_path, text):
    path = tmp_path / "horovodrun.cfg"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    # Unknown keys and sections, which horovodrun ignores: the closest known name.
    ("params:\n  fusion_treshold_mb: 32\n",
     "unknown key 'params.fusion_treshold_mb', which horovodrun ignores; "
     "did you mean 'params.fusion_threshold_mb'?"),
    ("stall:\n  enabled: true\n",
     "unknown section 'stall', which horovodrun ignores; did you mean 'stall_check'?"),
    ("params:\n  speed: 3\n", "unknown key 'params.speed', which horovodrun ignores; known in "
     "params: fusion_threshold_mb, cycle_time_ms, cache_capacity"),
    ("verbosity:\n  level: 3\n", "unknown section 'verbosity', which horovodrun ignores; known "
     "at the top level: controller, params, autotune"),
    ("contoller: gloo\n",
     "unknown key 'contoller', which horovodrun ignores; did you mean 'controller'?"),
    # Values of the wrong type: horovodrun fails with a traceback on some, and
    # passes the others on to the workers as they are.
    ("params:\n  fusion_threshold_mb: '64'\n",
     "'params.fusion_threshold_mb' must be an integer, got '64'"),
    ("params:\n  fusion_threshold_mb: 64.5\n",
     "'params.fusion_threshold_mb' must be an integer, got 64.5"),
    ("params:\n  hierarchical_allreduce: 'false'\n",
     "'params.hierarchical_allreduce' must be true or false, got 'false'"),
    ("params:\n  hierarchical_allreduce: 1\n",
     "'params.hierarchical_allreduce' must be true or false, got 1"),
    ("params:\n  cache_capacity: true\n", "'params.cache_capacity' must be an integer, got True"),
    ("params:\n  cycle_time_ms:\n", "'params.cycle_time_ms' must be a number, got None"),
    ("params:\n  cycle_time_ms: .nan\n", "'params.cycle_time_ms' must be finite, got nan"),
    ("timeline:\n  filename: 3\n", "'timeline.filename' must be a string, got 3"),
    ("controller: tcp\n", "'controller' must be one of gloo, mpi, got 'tcp'"),
    # Out of range.
    ("params:\n  fusion_threshold_mb: -1\n", "'params.fusion_threshold_mb' must be >= 0, got -1"),
    ("autotune:\n  gaussian_process_noise: 1.5\n",
     "'autotune.gaussian_process_noise' must be <= 1, got 1.5"),
    ("library_options:\n  gloo_timeout_seconds: 0\n",
     "'library_options.gloo_timeout_seconds' must be >= 1, got 0"),
    ("logging:\n  level: info\n", "'logging.level' must be one of TRACE, DEBUG"),
    # Beyond the C types Horovod reads them into.
    ("params:\n  fusion_threshold_mb: 9000000000000\n",
     "'params.fusion_threshold_mb' must be <= 8796093022207, got 9000000000000"),
    ("params:\n  cache_capacity: 4294967296\n",
     "'params.cache_capacity' must be <= 4294967295, got 4294967296"),
    ("stall_check:\n  shutdown_time_seconds: 2147483648\n",
     "'stall_check.shutdown_time_seconds' must be <= 2147483647, got 2147483648"),
    ("stall_check:\n  warning_time_seconds: 60\n  shutdown_time_seconds: 30\n",
     "'stall_check.shutdown_time_seconds' (30) is below 'warning_time_seconds' (60), so "
     "Horovod would never shut down"),
    ("timeline:\n  mark_cycles: true\n",
     "'timeline.mark_cycles' does nothing without 'timeline.filename'"),
    # The file's shape.
    ("params: 64\n", "'params' must be a section of keys (fusion_threshold_mb"),
    ("params:\n  - a\n  b: [\n", "is not valid YAML at line"),
    ("- params\n", "must hold sections (params:, stall_check:, ...), not list"),
    ("# only a comment\n", "is empty, which horovodrun cannot read; give it sections"),
    ("params:\n  cycle_time_ms: 1\nlogging:\n  level: INFO\nparams:\n  cache_capacity: 8\n",
     "'params' is given twice (lines 1 and 5) and YAML keeps only the last; merge the two"),
    ("params:\n  cycle_time_ms: 1\n  cycle_time_ms: 2\n", "'cycle_time_ms' is given twice"),
    ("? [a, b]\n: 1\n", "is not valid YAML at line 1"),
])
def test_mistakes_are_named(tmp_path, text, message):
    with pytest.raises(UsageError) as error:
        horovod_config.check(_write(tmp_path, text))
    assert message in str(error.value)


def test_a_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "horovodrun.cfg"
    path.write_bytes(b"\xff\xfe\x00params")
    with pytest.raises(UsageError, match="horovodrun.cfg is not a text file; horovodrun's "
                                         "--config-file is YAML text"):
        horovod_config.check(path)


@pytest.mark.parametrize("text", [
    "controller: Gloo\n",                      # horovodrun lower-cases it
    "params:\n  # fusion_threshold_mb: 64\n",   # a section whose keys are all commented out
    "params:\n  cycle_time_ms: 2\n",            # an integer where a number is expected
])
def test_what_horovodrun_accepts_is_accepted(tmp_path, text):
    horovod_config.check(_write(tmp_path, text))


def _what_horovodrun_reads():
    """{key: the horovodrun option it sets, or None}: horovodrun's own parser
    applied to a config of every key of the schema, with sections that record
    each key it asks for (so keys the schema lacks show up too)."""
    from horovod.runner.common.util import config_parser
    read, sentinels = set(), {}

    class Section(dict):
        def __init__(self, prefix, schema):
            super().__init__({key: Section(f"{prefix}{key}.", value) if isinstance(value, dict)
                              else sentinels.setdefault(f"{prefix}{key}", object())
                              for key, value in schema.items()})
            self.prefix = prefix

        def get(self, key, default=None):
            read.add(f"{self.prefix}{key}")
            return super().get(key, default)

    args = argparse.Namespace(use_gloo=True, use_mpi=False, autotune=None, no_stall_check=None)
    config_parser.set_args_from_config(args, Section("", horovod_config.SCHEMA), set())
    options = {id(value): dest for dest, value in vars(args).items()}
    return {key: options.get(id(sentinels.get(key))) for key in read}


def _horovodrun_options(monkeypatch):
    """{dest: argparse action} of horovodrun's own command line."""
    from horovod.runner import launch
    parsers = []

    def capture(parser, *args, **kwargs):
        parsers.append(parser)
        raise SystemExit

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        launch.parse_args()
    return {action.dest: action for action in parsers[0]._actions}


def _kind(action):
    return bool if action.nargs == 0 else action.type or str


def test_the_schema_knows_every_key_horovodrun_reads_with_its_type(monkeypatch):
    # A Horovod upgrade that reads another key, or one fewer, fails this test.
    reads = _what_horovodrun_reads()
    schema_keys = {f"{section}.{key}" if isinstance(keys, dict) else section
                   for section, keys in horovod_config.SCHEMA.items()
                   for key in (keys if isinstance(keys, dict) else [None])}
    assert set(reads) == schema_keys | set(SECTIONS_READ)
    options = _horovodrun_options(monkeypatch)
    checked = 0
    for key, dest in reads.items():
        if dest is None:        # sections, controller, stall_check.enabled (read as `not`)
            continue
        section, name = key.split(".")
        expected = horovod_config.SCHEMA[section][name]
        assert expected.kind is _kind(options[dest]), key
        if options[dest].choices:
            assert expected.choices == tuple(options[dest].choices), key
        checked += 1
    assert checked == len(schema_keys) - 2


SECTIONS_READ = ("params", "autotune", "timeline", "stall_check", "library_options", "logging")


def test_check_config_command(tmp_path):
    good = run(["hvdtrain", "check-config", CONFIG], timeout=60)
    assert good.returncode == 0 and "horovodrun.cfg is valid" in good.stdout
    bad = run(["hvdtrain", "check-config", _write(tmp_path, "params:\n  cycle_time: 5\n")],
              timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith(
        f"hvdtrain: error: {tmp_path / 'horovodrun.cfg'}: unknown key 'params.cycle_time'")
    missing = run(["hvdtrain", "check-config", tmp_path / "none.cfg"], timeout=60)
    assert missing.returncode == 2 and "No such file or directory; check the path" in missing.stderr


def test_horovodrun_accepts_the_config(monkeypatch):
    # horovodrun's own command line, parsed as for a launch: it reads the
    # file, applies it to its options and validates them.
    from horovod.runner import launch
    monkeypatch.setattr("sys.argv",
                        ["horovodrun", "--config-file", str(CONFIG), "-np", "1", "true"])
    args = launch.parse_args()
    assert (args.fusion_threshold_mb, args.stall_check_shutdown_time_seconds) == (64, 600)


@pytest.mark.parametrize("horovodrun, worker, config_file", [
    (["--config-file", "a.cfg", "-np", "2"], ["train.py"], "a.cfg"),
    (["--config-file=a.cfg", "-np", "2"], ["train.py"], "a.cfg"),
    # horovodrun's argparse takes abbreviations.
    (["--config", "a.cfg", "-np", "2"], ["train.py"], "a.cfg"),
    (["-np", "2", "-H", "localhost:2"], ["train.py"], None),
    # The worker's own option of that name is not horovodrun's.
    (["-np", "2"], ["train.py", "--config-file", "model.yaml"], None),
    (["--config-file", "a.cfg", "-np", "2"], ["train.py", "--config-file", "model.yaml"], "a.cfg"),
])
def test_the_launch_config_file_is_read_from_horovodruns_own_options(
        monkeypatch, horovodrun, worker, config_file):
    monkeypatch.setattr("sys.argv", worker)
    argv = ["python", "/venv/bin/horovodrun", *horovodrun, "python", *worker]
    assert horovod_config._config_file_option(argv) == config_file


def test_the_doctor_reports_a_config_with_an_empty_section(tmp_path):
    from hvdtrain.tools import doctor
    rows = dict(doctor._config(_write(tmp_path, "params:\n  # fusion_threshold_mb: 64\n")))
    assert rows["file"].endswith("horovodrun.cfg (valid)")


def test_whatever_check_accepts_horovodrun_accepts(tmp_path, monkeypatch):
    # Every key of the schema with values good and bad, one at a time: each
    # config check() passes must go through horovodrun's own parsing,
    # validation and conversion to the workers' environment.
    import copy
    import logging

    from horovod.runner import launch
    from horovod.runner.common.util import config_parser
    monkeypatch.setattr("sys.argv", ["horovodrun", "-np", "1", "true"])
    defaults = launch.parse_args()
    values = [None, True, False, 0, -1, 1, 2.5, -0.5, float("nan"), float("inf"), "x", "gloo",
              "Mpi", "WARNING", "info", 10**20]
    configs = [{name: value} for name, keys in horovod_config.SCHEMA.items()
               if not isinstance(keys, dict) for value in values]
    configs += [{name: {key: value}} for name, keys in horovod_config.SCHEMA.items()
                if isinstance(keys, dict) for key in keys for value in values]
    accepted = 0
    for config in configs:
        try:
            horovod_config.check(_write(tmp_path, yaml.safe_dump(config)))
        except UsageError:
            continue
        args = copy.deepcopy(defaults)
        args.use_gloo = args.use_mpi = False
        config_parser.set_args_from_config(args, config, set())
        config_parser.validate_config_args(args)
        config_parser.set_env_from_args({}, args)
        if args.log_level:      # horovodrun hands it to Python's logging
            assert isinstance(logging.getLevelName(args.log_level), int), config
        accepted += 1
    assert accepted > 40, accepted
