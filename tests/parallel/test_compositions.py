"""Every composition of data (D), tensor (T) and pipeline (P) parallelism
through the `hvdtrain` command, to the exit of every process: `hvdtrain
train` exits 0 on every rank with the export written, `hvdtrain evaluate`
at the layout it trained with reports what training's last validation did,
and the export, loaded with plain `keras.saving.load_model`, scores the
validation split as the split model did (loss within 1e-4: float32 sums
in another order). No process is left behind; no rank reports an error.
A rank that fails or hangs at a composition is named, a failing one by the
others with its line.

Own launches: the shared launches (tests/ranked) keep their processes alive
between tests, so none of them sees ranks leave a run at different times
(a pipeline's stage leaders still gathering the export while the other
ranks are done): here each run is a launch of its own, to its end.
"""

import json
import re

import keras
import numpy as np
import pytest

from launch import REPO, horovodrun, rank_lines, running, start_horovodrun

FAULTS = REPO / "tests" / "recipes" / "faults.py"

# A gpt small enough for 8 processes on 2 cores: 2 steps of 2 replicas.
TINY_GPT = ["--recipe=gpt", "--option=train_sequences=64", "--option=validation_sequences=32",
            "--option=sequence_length=8", "--option=d_model=16", "--option=mlp_dim=32",
            "--option=heads=2", "--batch_size=16"]
PIPELINE = ["--pipeline_parallel=2", "--microbatches=4"]
ONE_THREAD = ["--intra_op_threads=1", "--epochs=1"]

# The pipeline alone on the default recipe; gpt's tied embedding, held by
# its first and last stages, in every composition with a pipeline.
COMPOSITIONS = {
    "P2 digits_cnn": (2, ["--recipe=digits_cnn", "--pipeline_parallel=2"]),
    "D2xP2 gpt": (4, [*TINY_GPT, *PIPELINE]),
    "T2xP2 gpt": (4, [*TINY_GPT, *PIPELINE, "--tensor_parallel=2"]),
    "D2xT2 gpt": (4, [*TINY_GPT, "--tensor_parallel=2"]),
    "D2xT2xP2 gpt": (8, [*TINY_GPT, *PIPELINE, "--tensor_parallel=2"]),
}


def _run(np_, args, timeout):
    result = horovodrun(args, np=np_, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    errors = [text for _, text in rank_lines(output) if "hvdtrain: error" in text]
    assert not errors and "Traceback" not in output, output[-4000:]
    return output


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("composition", COMPOSITIONS, ids=list(COMPOSITIONS))
def test_each_composition_trains_evaluates_and_exports_to_the_exit_of_every_rank(
        tmp_path, composition):
    workers, flags = COMPOSITIONS[composition]
    model_dir = tmp_path / "run"
    data = [f"--data_dir={tmp_path / 'data'}"]
    trained = _run(workers, ["hvdtrain", "train", f"--model_dir={model_dir}", *flags,
                             *ONE_THREAD, *data], timeout=480)
    assert not running(str(model_dir))
    reported = float(re.findall(r"val_loss: ([\d.]+)", trained)[-1])

    _run(workers, ["hvdtrain", "evaluate", f"--model_dir={model_dir}", "--intra_op_threads=1",
                   *data], timeout=300)
    assert not running(str(model_dir))
    evaluated = json.loads((model_dir / "evaluation-validation.json").read_text())["metrics"]
    assert evaluated["loss"] == pytest.approx(reported, abs=1e-4)

    exported = keras.saving.load_model(model_dir / "model.keras", compile=False)
    assert {type(layer).__module__.split(".")[0] for layer in exported.layers} == {"keras"}
    x, y = _validation(flags, tmp_path / "data")
    logits = exported.predict(x, batch_size=64, verbose=0)
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                      from_logits=True)))
    assert loss == pytest.approx(evaluated["loss"], abs=1e-4)


def _validation(flags, data_dir):
    """(inputs, targets) of the recipe's whole validation split, as `flags`
    make it."""
    options = dict(flag.removeprefix("--option=").split("=") for flag in flags
                   if flag.startswith("--option="))
    if "--recipe=digits_cnn" in flags:
        import tensorflow_datasets as tfds

        from hvdtrain.datasets import digits

        split = tfds.as_numpy(digits.prepare(str(data_dir)).as_dataset("validation",
                                                                       batch_size=-1))
        return split["image"].astype("float32") / 255.0, split["label"]
    from hvdtrain.recipes import gpt

    from hvdtrain import recipe as recipe_lib

    config = recipe_lib.make_config("gpt", options=[f"{k}={v}" for k, v in options.items()])
    settings = config.options
    _, validation, _ = gpt.synthetic_corpus(
        settings["vocab_size"], settings["successors"], settings["sequence_length"],
        settings["train_sequences"], settings["validation_sequences"], settings["language_seed"])
    return validation[:, :-1], validation[:, 1:]


def test_a_rank_that_fails_or_hangs_at_a_composition_is_named_and_ends_every_rank(tmp_path):
    """Side by side (the hang is mostly waiting): at T=2 x P=2, rank 1
    (stage 0, tensor-parallel rank 1) reads NaN features, the ranks of its
    pipeline find the loss NaN, and the others stop naming one of them in
    its own words, never as a rank that finished; at D=2 x P=2, rank 3's
    input hangs and the watchdog ends every rank, naming it."""
    jobs = {}
    for fault, flags, rank in (("nan", ["--tensor_parallel=2"], "1"),
                               ("hang", ["--stall_timeout=6"], "3")):
        run_dir = tmp_path / fault
        run_dir.mkdir()
        jobs[fault] = run_dir, start_horovodrun(
            ["hvdtrain", "train", f"--recipe={FAULTS}", f"--model_dir={run_dir / 'run'}",
             "--pipeline_parallel=2", "--microbatches=2", "--checkpoint_steps=4", *flags,
             *ONE_THREAD], run_dir / "log", np=4,
            env=dict(FAULT=fault, FAULT_RANK=rank, FAULT_EPOCH="0", FAULT_STEP="2"))
    outputs = {}
    for fault, (run_dir, job) in jobs.items():
        status = job.wait(timeout=300)
        outputs[fault] = output = (run_dir / "log").read_text()
        assert status != 0 and "Traceback" not in output, output[-4000:]
        assert not running(str(run_dir / "run")), fault

    errors = {rank: text for rank, text in rank_lines(outputs["nan"])
              if "hvdtrain: error:" in text}
    failed = {rank: text.removeprefix("hvdtrain: error: ") for rank, text in errors.items()
              if "stopped because" not in text}
    assert failed and all(re.fullmatch(r"the loss is nan at epoch 1, step \d+ on rank \d; .*", t)
                          for t in failed.values()), outputs["nan"][-4000:]
    for rank, text in errors.items():
        if rank not in failed:
            named = re.fullmatch(r"hvdtrain: error: stopped because rank (\d) failed: (.*)",
                                 text)
            assert named and named.group(2) == failed[int(named.group(1))], text

    assert any(text.startswith("hvdtrain: error: no progress for 18 s: rank 3 stopped making "
                               "progress (rank 3 on ") and ": training epoch 1, step 3, idle "
               in text for _, text in rank_lines(outputs["hang"])), outputs["hang"][-4000:]
