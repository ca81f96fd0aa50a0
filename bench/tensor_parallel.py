"""Tensor parallelism (T=2) against data parallelism at np=2, on the gpt recipe's model.

    python bench/tensor_parallel.py [--d_model=256 --layers=4 ...]

launches itself under `horovodrun -np 2` (one intra-op thread per process)
and trains the recipe's GPT two ways, side by side on the same global batch
of the synthetic language, one epoch at a time, the order turned each epoch:
  data_parallel    T=1: each worker holds the whole model and trains on half
                   the global batch; gradients are allreduced (the baseline);
  tensor_parallel  T=2: one replica of two ranks, each holding half of every
                   split weight and computing its half of every layer on the
                   whole global batch.
It reports:
  - the bytes of the weights and AdamW's state (its two moments) on one
    worker, in all and of the split weights alone (goal: the split part at
    1/T of data parallelism's);
  - the training rate of tensor_parallel relative to data_parallel's, the
    median over the epochs after the first;
  - the bytes the tensor-parallel layers exchange per step, measured in
    Horovod's timeline of an epoch (each collective's output shape), as
    allreduces of batch x sequence x d_model against Megatron-LM's count of
    4 per layer (2 forward, 2 backward); the vocabulary-parallel embedding
    and head add 2, the loss three numbers per token.
Rank 0 prints a table and writes JSON, with the timeline beside it.
"""

import json
import pathlib
import re

import numpy as np
from absl import app, flags

import horovod_workers

flags.DEFINE_integer("d_model", 128, "Width of the model.")
flags.DEFINE_integer("layers", 2, "Transformer blocks.")
flags.DEFINE_integer("heads", 4, "Attention heads.")
flags.DEFINE_integer("mlp_dim", 512, "Width of each block's MLP.")
flags.DEFINE_integer("vocab_size", 1024, "Tokens.")
flags.DEFINE_integer("sequence_length", 64, "Tokens per sequence.")
flags.DEFINE_integer("global_batch", 16, "Sequences per step, over both workers.")
flags.DEFINE_integer("epochs", 5, "Epochs each trains: one ratio per epoch after the first.")
flags.DEFINE_integer("steps", 12, "Steps per epoch.")
flags.DEFINE_integer("warmup_steps", 2, "Steps of each epoch left out of its throughput.")
flags.DEFINE_integer("window_steps", 5, "Steps per timed window.")
flags.DEFINE_string("output", "runs/bench/tensor_parallel.json",
                    "Where rank 0 writes the results.")
flags.DEFINE_bool("worker", False, "Internal: run as one Horovod worker.")
FLAGS = flags.FLAGS
RUNS = ("data_parallel", "tensor_parallel")
SIZES = ("d_model", "layers", "heads", "mlp_dim", "vocab_size", "sequence_length")


def launch():
    output = pathlib.Path(FLAGS.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    r = horovod_workers.run(
        __file__, output, epochs=FLAGS.epochs, steps=FLAGS.steps,
        global_batch=FLAGS.global_batch, warmup_steps=FLAGS.warmup_steps,
        window_steps=FLAGS.window_steps, **{name: getattr(FLAGS, name) for name in SIZES})
    print(f"gpt at np=2: {FLAGS.layers} blocks of d_model {FLAGS.d_model}, {FLAGS.heads} heads, "
          f"MLP {FLAGS.mlp_dim}, vocabulary {FLAGS.vocab_size}, {FLAGS.sequence_length} tokens, "
          f"global batch {FLAGS.global_batch}, AdamW; one intra-op thread each, Gloo; "
          f"{FLAGS.epochs - 1} epochs timed")
    print(f"{'run':>16}{'MiB/worker':>12}{'/ first':>9}{'split MiB':>11}{'/ first':>9}"
          f"{'sequences/s':>13}{'/ first':>9}{'range':>14}")
    for name in RUNS:
        ratios = r["ratios"].get(name)
        memory, split = r["bytes"][name], r["split_bytes"][name]
        print(f"{name:>16}{memory / 2**20:>12.2f}{memory / r['bytes'][RUNS[0]]:>9.3f}"
              f"{split / 2**20:>11.2f}{split / r['split_bytes'][RUNS[0]]:>9.3f}"
              f"{r['examples_per_second'][name]:>13.1f}" + (
                  f"{r['ratio'][name]:>9.3f}{min(ratios):>8.3f}-{max(ratios):.3f}"
                  if ratios else ""))
    exchanged = r["exchanged"]
    print(f"tensor_parallel exchanges {exchanged['bytes_per_step'] / 2**20:.2f} MiB per step "
          f"in its layers' collectives: {exchanged['activations_per_step']:.2f} allreduces of "
          f"batch x sequence x d_model, against Megatron-LM's {exchanged['megatron']} "
          f"(4 per block) + 2 for the vocabulary-parallel embedding and head; "
          f"{exchanged['per_token_numbers']:.1f} numbers per token besides (the loss)")
    print(f"noise: data_parallel's rate / its rate in the epoch before: "
          f"{r['noise'][0]:.3f}-{r['noise'][1]:.3f}. JSON: {FLAGS.output}")


def work(scratch):
    import keras
    import numpy as np
    from hvdtrain.recipes import gpt

    import hvdtrain
    from hvdtrain import callbacks, layout
    from hvdtrain.parallel import split_variables
    from hvdtrain.recipe import make_config

    hvdtrain.init(intra_op_threads=1, tensor_parallel=2, timeline=True)
    options = {name: getattr(FLAGS, name) for name in SIZES}
    examples = FLAGS.steps * FLAGS.global_batch
    tokens, _, _ = gpt.synthetic_corpus(FLAGS.vocab_size, 4, FLAGS.sequence_length, examples,
                                        1, 0)

    def build(name):
        tensor_parallel = 2 if name == "tensor_parallel" else 1
        layout.arrange(tensor_parallel)
        keras.utils.set_random_seed(0)
        model = gpt.build_model(make_config("gpt", options=options,
                                            tensor_parallel=tensor_parallel))
        model.compile(hvdtrain.DistributedOptimizer(keras.optimizers.AdamW(1e-3),
                                                    process_set=layout.data_set()),
                      loss=gpt.RECIPE.loss)
        model.optimizer.build(model.trainable_variables)
        batch = FLAGS.global_batch // layout.data_size()
        mine = tokens[layout.data_rank()::layout.data_size()]
        meter = callbacks.Throughput(batch / layout.tensor_size(), FLAGS.warmup_steps,
                                     FLAGS.window_steps)
        return dict(model=model, tensor_parallel=tensor_parallel, batch=batch, meter=meter,
                    inputs=mine[:, :-1], targets=mine[:, 1:],
                    callbacks=callbacks.in_order([meter, callbacks.BroadcastInitialState(0)]))

    runs = {name: build(name) for name in RUNS}
    # Both models hold the same variables in the same order, whole or split.
    state = {name: [*runs[name]["model"].weights, *runs[name]["model"].optimizer.variables]
             for name in RUNS}
    split = [split_variables.is_sharded(v) for v in state["tensor_parallel"]]

    def state_bytes(name, split_only):
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                   for v, is_split in zip(state[name], split) if is_split or not split_only)

    def fit(name, epoch, extra=None):
        run = runs[name]
        layout.arrange(run["tensor_parallel"])
        run["model"].fit(run["inputs"], run["targets"], batch_size=run["batch"],
                         epochs=epoch + 1, initial_epoch=epoch, shuffle=False, verbose=0,
                         callbacks=[*run["callbacks"], *(extra or [])])
        return run["meter"].epoch_measurement.total.mean if epoch else None

    measured = horovod_workers.side_by_side(RUNS, fit, FLAGS.epochs)
    timeline = pathlib.Path(FLAGS.output).with_suffix(".timeline.json")   # kept, to look at
    recorded = FLAGS.epochs * FLAGS.steps   # the global steps before this epoch
    recorder = callbacks.HorovodTimeline(timeline, recorded + 1, recorded + FLAGS.steps)
    fit("tensor_parallel", FLAGS.epochs, [recorder])
    if hvdtrain.is_main_process():
        pathlib.Path(FLAGS.output).write_text(json.dumps(dict(
            measured, workers=hvdtrain.size(),
            bytes={n: state_bytes(n, False) for n in RUNS},
            split_bytes={n: state_bytes(n, True) for n in RUNS},
            exchanged=_exchanged(timeline, FLAGS.steps)), indent=1))


def _exchanged(timeline, steps):
    """Bytes per step of the tensor-parallel layers' collectives, from the
    output shapes Horovod's timeline records for each (4 bytes per float32)."""
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    elements, per_token = 0, 0
    for event in events:
        shape = event.get("args", {}).get("shape")
        name = names.get(event.get("pid"), "")
        if event.get("ph") != "E" or not shape or not name.startswith("hvdtrain.tensor."):
            continue
        size = int(np.prod([int(d) for d in re.findall(r"\d+", shape)]))
        if ".loss" in name or "_crossentropy" in name:
            per_token += size
        else:
            elements += size
    activation = FLAGS.global_batch * FLAGS.sequence_length * FLAGS.d_model
    tokens = FLAGS.global_batch * FLAGS.sequence_length
    return dict(bytes_per_step=4 * (elements + per_token) / steps,
                activations_per_step=elements / steps / activation,
                megatron=4 * FLAGS.layers, per_token_numbers=per_token / steps / tokens)


if __name__ == "__main__":
    app.run(horovod_workers.main(launch, work))
