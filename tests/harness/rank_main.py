"""One rank of a ranked launch: `horovodrun -np N ... python rank_main.py
WORKDIR` runs pytest over the test ids in WORKDIR/items.txt on every rank,
Horovod initialised once for all of them (with dynamic process sets, so that
tests can make their own, and a timeline that a test may start and stop, as
hvdtrain.init(timeline=True) allows), one intra-op thread per process."""

import os
import pathlib
import sys

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")

import pytest  # noqa: E402

import hvdtrain  # noqa: E402
from harness.fixtures import WORKDIR  # noqa: E402
from harness.rank_plugin import RankPlugin  # noqa: E402


def main(workdir):
    os.environ[WORKDIR] = str(workdir)
    hvdtrain.init(intra_op_threads=1)
    nodeids = (workdir / "items.txt").read_text().splitlines()
    plugin = RankPlugin(workdir, hvdtrain.rank(), hvdtrain.size(), nodeids, os.dup(2))
    return pytest.main([*nodeids, "-p", "no:timeout", "-p", "no:cacheprovider", "-q",
                        "--no-header", f"--basetemp={workdir / f'rank{hvdtrain.rank()}'}"],
                       plugins=[plugin])


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
