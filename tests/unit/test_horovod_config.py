"""`hvdtrain check-config`: horovodrun's --config-file checked strictly."""

import pytest
import yaml

from hvdtrain import horovod_config
from hvdtrain.errors import UsageError
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
    ("params:\n  fusion_treshold_mb: 32\n",
     "unknown key 'params.fusion_treshold_mb' (horovodrun would ignore it); known here: "
     "fusion_threshold_mb, cycle_time_ms"),
    ("stall:\n  enabled: true\n", "unknown key 'stall' (horovodrun would ignore it)"),
    ("params:\n  fusion_threshold_mb: -1\n", "'params.fusion_threshold_mb' must be >= 0, got -1"),
    ("params:\n  fusion_threshold_mb: 64.5\n",
     "'params.fusion_threshold_mb' must be an integer, got 64.5"),
    ("params:\n  hierarchical_allreduce: 1\n",
     "'params.hierarchical_allreduce' must be true or false, got 1"),
    ("params:\n  cache_capacity: true\n", "'params.cache_capacity' must be an integer, got True"),
    ("autotune:\n  gaussian_process_noise: 1.5\n",
     "'autotune.gaussian_process_noise' must be <= 1, got 1.5"),
    ("logging:\n  level: verbose\n", "'logging.level' must be one of TRACE, DEBUG"),
    ("params: 64\n", "'params' must be a section of keys (fusion_threshold_mb"),
    ("stall_check:\n  warning_time_seconds: 60\n  shutdown_time_seconds: 30\n",
     "'stall_check.shutdown_time_seconds' (30) is below 'warning_time_seconds' (60), so "
     "Horovod would never shut down"),
    ("params:\n  - a\n  b: [\n", "is not valid YAML at line"),
    ("- params\n", "must hold sections (params:, stall_check:, ...), not list"),
])
def test_mistakes_are_named(tmp_path, text, message):
    with pytest.raises(UsageError) as error:
        horovod_config.check(_write(tmp_path, text))
    assert message in str(error.value)


def test_the_schema_knows_every_key_horovodrun_reads():
    # horovodrun's own parser reads these keys; a Horovod upgrade that adds
    # one makes this test fail until the schema knows it.
    from horovod.runner.common.util import config_parser
    source = open(config_parser.__file__).read()
    for section, keys in horovod_config.SCHEMA.items():
        assert f"'{section}'" in source
        for key in keys if isinstance(keys, dict) else ():
            assert f"'{key}'" in source, f"{section}.{key}"


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


def test_horovodrun_accepts_the_config(tmp_path):
    # horovodrun parses it as it would for a launch (then --check-build stops).
    result = run(["horovodrun", "--config-file", CONFIG, "--check-build"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(CONFIG.read_text())
