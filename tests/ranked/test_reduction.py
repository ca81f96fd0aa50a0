"""Each option of the gradient reduction at np=2 against the single-process
update it must equal (the global batch on one process)."""

import json

import horovod.tensorflow as hvd
import numpy as np
import pytest

from launch import run, worker
from ranked.support import computed_once, gathered
from workers import local_gradients, rank_names, variants

BASE = {"model": "dense", "loop": "fit", "lr": 0.5, "passes": 1, "examples": 16}


def variant(name, **changes):
    return {**BASE, "name": name, **changes}


# name: (the variant at np=2, its single-process reference, tolerance: rtol on the update)
CASES = {
    "average": (variant("average"), variant("average"), 1e-5),
    "sum is size x average": (variant("sum", options={"op": "sum"}), variant("lr_x2", lr=1.0),
                              1e-5),
    "fp16 compression": (variant("fp16", options={"compression": "fp16"}), variant("average"),
                         2e-3),
    "bf16 compression": (variant("bf16", options={"compression": "bf16"}), variant("average"),
                         2e-2),
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
        variant("tape_sparse_fp16", loop="tape", model="embedding",
                options={"compression": "fp16"}),
        variant("embedding", model="embedding"), 2e-3),
}
# Compression must really happen: these differ from the exact update.
LOSSY = {"fp16 compression", "bf16 compression", "gradient tape, sparse, fp16"}


def _updates(path):
    arrays = np.load(path)
    half = len(arrays.files) // 2
    return ([arrays[f"arr_{i}"] for i in range(half)],
            [arrays[f"arr_{i + half}"] for i in range(half)])


def _single_process_references(out):
    unique = {v["name"]: v for _, v, _ in CASES.values()}
    result = run([*worker("variants"), out, json.dumps(list(unique.values()))])
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def references():
    """Every case's reference, computed by one process alone."""
    return computed_once("reduction-references", _single_process_references)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_np2_equals_single_process_reference(case, references):
    np2, reference, rtol = CASES[case]
    (initial, after), (_, after_rank1) = gathered(variants.run(np2))
    reference_initial, expected = _updates(references / f"{reference['name']}.rank0.npz")
    for init, ref_init, got, want, got1 in zip(initial, reference_initial, after, expected,
                                               after_rank1):
        np.testing.assert_array_equal(init, ref_init)
        np.testing.assert_array_equal(got, got1)  # the ranks agree bit for bit
        assert np.abs(want - init).max() > 1e-3, "the reference update is empty"
        np.testing.assert_allclose(got - init, want - init, rtol=rtol,
                                   atol=rtol * np.abs(want - init).max())
    if case in LOSSY:
        assert any(not np.allclose(got, want, rtol=1e-6, atol=0)
                   for got, want in zip(after, expected))


@pytest.mark.launches(controllers=("gloo",))
def test_own_process_sets_train_each_rank_on_its_shard(tmp_path):
    alone = variant("alone", options={"own_process_set": True})
    own_sets = [hvd.add_process_set([r]) for r in range(hvd.size())]
    try:
        trained = gathered(variants.run(alone, own_sets))
    finally:
        for process_set in own_sets:
            hvd.remove_process_set(process_set)
    shards = [variant(f"shard{r}", shard=r, examples=16) for r in (0, 1)]
    result = run([*worker("variants"), tmp_path, json.dumps(shards)])
    assert result.returncode == 0, result.stderr[-3000:]
    for r in (0, 1):
        initial, after = trained[r]
        _, expected = _updates(tmp_path / f"shard{r}.rank0.npz")
        for init, got, want in zip(initial, after, expected):
            assert not np.allclose(got, init)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.launches(controllers=("gloo",))
def test_ranks_whose_layers_are_named_differently_train_together(shared_tmp_path, capsys):
    # Rank 1's auto-generated layer names are shifted by a throwaway layer;
    # then Horovod's load_model test (rank 0 loads the model it saved, the
    # others build a new one) twice in one process; two optimizers in one step.
    # Collectives named after layers would block every rank, ones named alike would collide.
    rank_names.extra_layer()
    rank_names.load_twice(shared_tmp_path)
    rank_names.two_optimizers()
    mine = [line.split()[1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("trained")]
    trained = [(rank, case) for rank, cases in enumerate(gathered(mine)) for case in cases]
    cases = ["extra_layer", "extra_layer_tape", "load_twice1_saved", "load_twice1",
             "load_twice2_saved", "load_twice2", "two_optimizers"]
    assert sorted(trained) == sorted((r, c) for r in (0, 1) for c in cases)


@pytest.mark.launches(np=3)
def test_a_rank_outside_the_process_set_keeps_its_own_gradients():
    partial_set = hvd.add_process_set([0, 1])
    try:
        (own0, *updates0), (own1, *updates1), (own2, *updates2) = gathered(
            local_gradients.steps("partial_set", process_set=partial_set))
    finally:
        hvd.remove_process_set(partial_set)
    for updates in (updates0, updates1):   # in the set [0, 1]: averaged over it, lr 1
        for update in updates:
            for got, g0, g1 in zip(update, own0, own1):
                np.testing.assert_allclose(got, -(g0 + g1) / 2, rtol=1e-5, atol=1e-7)
    for update in updates2:
        for got, g2 in zip(update, own2):
            np.testing.assert_allclose(got, -g2, rtol=1e-5, atol=1e-7)


@pytest.mark.launches(controllers=("gloo",))
def test_local_variables_keep_their_own_gradients_scaled_as_in_horovod():
    (own0, *updates0), (own1, *updates1) = gathered(local_gradients.steps("local", scaled=True))
    for own, updates in ((own0, updates0), (own1, updates1)):
        for update in updates:
            # The first layer's kernel and bias averaged; the second layer's
            # this rank's own, divided by the size (scale_local_gradients).
            for got, g0, g1 in zip(update[:2], own0, own1):
                np.testing.assert_allclose(got, -(g0 + g1) / 2, rtol=1e-5, atol=1e-7)
            for got, mine in zip(update[2:], own[2:]):
                np.testing.assert_allclose(got, -mine / 2, rtol=1e-5, atol=1e-7)
    assert not np.allclose(updates0[0][2], updates1[0][2])
