"""Each option of the gradient reduction at np=2 against the single-process
update it must equal (the global batch on one process)."""

import json

import numpy as np
import pytest

from launch import horovodrun, run, worker

BASE = {"model": "dense", "loop": "fit", "lr": 0.5, "passes": 1, "examples": 16}


def variant(name, **changes):
    return {**BASE, "name": name, **changes}


# name: (the variant at np=2, its single-process reference, tolerance: rtol on the update)
CASES = {
    "average": (variant("average"), variant("average"), 1e-5),
    "sum is size x average": (variant("sum", options={"op": "sum"}), variant("lr_x2", lr=1.0), 1e-5),
    "fp16 compression": (variant("fp16", options={"compression": "fp16"}), variant("average"), 2e-3),
    "bf16 compression": (variant("bf16", options={"compression": "bf16"}), variant("average"), 2e-2),
    "predivide factor": (variant("predivide", options={"gradient_predivide_factor": 2.0}),
                         variant("average"), 1e-5),
    "two groups": (variant("groups2", options={"groups": 2}), variant("average"), 1e-5),
    "groups of variables": (variant("groups_list", options={"groups": "first_layer"}),
                            variant("average"), 1e-5),
    "accumulation averaged": (
        variant("accumulate_avg", passes=2, examples=32,
                options={"average_aggregated_gradients": True}),
        variant("big_batch", examples=32), 1e-5),
    "accumulation summed": (variant("accumulate_sum", passes=2, examples=32),
                            variant("big_batch_lr_x2", examples=32, lr=1.0), 1e-5),
    "sparse embeddings allgathered": (variant("sparse", model="embedding"),
                                      variant("embedding", model="embedding"), 1e-5),
    "sparse embeddings as dense": (
        variant("sparse_as_dense", model="embedding", options={"sparse_as_dense": True}),
        variant("embedding", model="embedding"), 1e-5),
    "gradient tape": (variant("tape", loop="tape"), variant("average"), 1e-5),
    "gradient tape, sparse, fp16": (
        variant("tape_sparse_fp16", loop="tape", model="embedding", options={"compression": "fp16"}),
        variant("embedding", model="embedding"), 2e-3),
}
# Compression must really happen: these differ from the exact update.
LOSSY = {"fp16 compression", "bf16 compression", "gradient tape, sparse, fp16"}


def _updates(path):
    arrays = np.load(path)
    half = len(arrays.files) // 2
    return ([arrays[f"arr_{i}"] for i in range(half)],
            [arrays[f"arr_{i + half}"] for i in range(half)])


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("np1")
    unique = {v["name"]: v for _, v, _ in CASES.values()}
    result = run([*worker("variants"), out, json.dumps(list(unique.values()))])
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module", params=["gloo", "mpi"])
def distributed(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    result = horovodrun([*worker("variants"), out, json.dumps([v for v, _, _ in CASES.values()])],
                        controller=request.param)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_np2_equals_single_process_reference(case, distributed, references):
    np2, reference, rtol = CASES[case]
    initial, after = _updates(distributed / f"{np2['name']}.rank0.npz")
    reference_initial, expected = _updates(references / f"{reference['name']}.rank0.npz")
    _, after_rank1 = _updates(distributed / f"{np2['name']}.rank1.npz")
    for init, ref_init, got, want, got1 in zip(initial, reference_initial, after, expected,
                                               after_rank1):
        np.testing.assert_array_equal(init, ref_init)
        np.testing.assert_array_equal(got, got1)  # the ranks agree bit for bit
        assert np.abs(want - init).max() > 1e-3, "the reference update is empty"
        np.testing.assert_allclose(got - init, want - init, rtol=rtol,
                                   atol=rtol * np.abs(want - init).max())
    if case in LOSSY:
        assert any(not np.allclose(got, want, rtol=1e-6, atol=0) for got, want in zip(after, expected))


def test_own_process_sets_train_each_rank_on_its_shard(tmp_path, references):
    alone = variant("alone", options={"own_process_set": True})
    result = horovodrun([*worker("variants"), tmp_path, json.dumps([alone])])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shards = [variant(f"shard{r}", shard=r, examples=16) for r in (0, 1)]
    result = run([*worker("variants"), tmp_path, json.dumps(shards)])
    assert result.returncode == 0, result.stderr[-3000:]
    for r in (0, 1):
        initial, after = _updates(tmp_path / f"alone.rank{r}.npz")
        _, expected = _updates(tmp_path / f"shard{r}.rank0.npz")
        for init, got, want in zip(initial, after, expected):
            assert not np.allclose(got, init)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
