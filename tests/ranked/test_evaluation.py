"""Distributed evaluation equals a single-process evaluation of the whole split."""

import json

import pytest

from launch import run, worker
from ranked.support import computed_once, gathered
from workers import evaluate

EXAMPLES = [101, 96]


def _single_process_evaluations(out):
    result = run([*worker("evaluate"), out, *EXAMPLES])
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def references():
    """Each split's evaluation by one process alone."""
    return computed_once("evaluation-references", _single_process_evaluations)


@pytest.mark.launches(controllers=("gloo",))
@pytest.mark.parametrize("examples", EXAMPLES)
def test_uneven_split_evaluates_exactly(examples, references):
    # 101: shards of 51 and 50 examples, 7 batches each, the last ones short.
    np2 = gathered(evaluate.run(examples))[0]["results"]   # rank 0's, as it wrote them
    np1 = json.loads((references / f"np1.{examples}.json").read_text())["results"]
    assert set(np2) == set(np1) == {"loss", "accuracy", "sparse_top_k_categorical_accuracy"}
    for name in np1:
        assert np2[name] == pytest.approx(np1[name], rel=1e-6), name
