"""The settings of one training run: recipe defaults, then user overrides,
checked as a whole before any process starts working."""

import dataclasses
import hashlib
import math
import pathlib
import typing
from collections.abc import Callable

from hvdtrain import lr_schedules
from hvdtrain.errors import UsageError
from hvdtrain.faults import preemption

__all__ = ["CLIPPING", "COMPRESSIONS", "NON_NEGATIVE", "OPTIMIZERS", "Optimizer", "POSITIVE",
           "Range", "TrainConfig"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """How the trainer builds an optimizer: its keras.optimizers class, and
    its arguments of its own (besides the learning rate and the knobs every
    Keras optimizer takes: weight decay, clipping, EMA) from the config."""
    keras_class: str
    arguments: Callable = lambda config: {}


# The --optimizer choices: every optimizer of keras.optimizers (a test checks
# the list against the installed Keras), by its class's name in lower case,
# and how the trainer builds each.
OPTIMIZERS = {
    "sgd": Optimizer("SGD", lambda config: {"momentum": config.momentum,
                                            "nesterov": config.nesterov}),
    "rmsprop": Optimizer("RMSprop", lambda config: {"momentum": config.momentum}),
    **{name.lower(): Optimizer(name) for name in (
        "Adam", "AdamW", "Adafactor", "Adagrad", "Adadelta", "Adamax", "Ftrl", "Lamb", "Lion",
        "Muon", "Nadam", "ScheduleFreeAdamW")},
}
# Settings that only some optimizers take: a value other than the default
# with another optimizer is refused rather than ignored.
_OPTIMIZER_SETTINGS = {"nesterov": ("sgd",)}
# Optimizers whose update of a weight reads all of it (norms, factored
# moments, orthogonalisation): not with the weight split over ranks.
_WHOLE_WEIGHT_OPTIMIZERS = ("Adafactor", "Lamb", "Muon")
# Keras's gradient clipping: at most one of these.
CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")
# The --compression choices: the names of compression.Compression's algorithms
COMPRESSIONS = ("none", "fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: finite, from `low` (`above`
    excludes it) up to below `high` (`up_to` includes it)."""
    low: float
    high: float = math.inf
    above: bool = False
    up_to: bool = False

    def describe(self):
        low, high = _text(self.low), _text(self.high)
        if self.high == math.inf:
            return "positive" if self.above and self.low == 0 else (
                f"> {low}" if self.above else f">= {low}")
        return f"in {'(' if self.above else '['}{low}, {high}{']' if self.up_to else ')'}"

    def __contains__(self, value):
        return (math.isfinite(value)
                and (value > self.low if self.above else value >= self.low)
                and (value <= self.high if self.up_to else value < self.high))


def _text(number):
    return str(int(number)) if math.isfinite(number) and number == int(number) else f"{number:g}"


POSITIVE = Range(0, above=True)
NON_NEGATIVE = Range(0)


def _setting(default, help, choices=None):
    """A setting's default and the help of its flag; `choices`: the values
    it may take."""
    return dataclasses.field(default=default, metadata={"help": help} | (
        {"choices": choices} if choices else {}))


def _number(default, allowed, help):
    """A numeric setting: its values are checked against the Range `allowed`."""
    return dataclasses.field(default=default, metadata={"help": help, "range": allowed})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The settings of one training run, each declared once.

    A recipe gives the defaults (`hvdtrain.recipe.make_config`), the user
    overrides some (`override`), and `validate` checks them as a whole before
    training starts. Each field holds its default, and in its metadata the
    help of its flag and the values it may take (`choices`, or a number's
    `range`): the command line's flags are made from those fields, one per
    field but `options` (see cli.py), so a new setting is a new field only.

    Args:
        options: The recipe's own settings (`Recipe.options`), set by
            `--option=NAME=VALUE`. Every other field is a setting whose help
            (in its metadata, and in `hvdtrain train --help`) says what it does.
    """
    recipe: str = _setting("digits_cnn", "Recipe to train: a module of recipes/.")
    epochs: int = _number(10, POSITIVE, "Epochs to train.")
    batch_size: int = _number(32, POSITIVE, "Batch size per worker (global: workers x this).")
    learning_rate: float = _number(
        0.01, POSITIVE, "One worker's learning rate; scaled by the number of workers.")
    # Linear from one worker's rate to the scaled one
    warmup_epochs: float = _number(
        2.0, NON_NEGATIVE, "Epochs of linear warm-up to the scaled learning rate.")
    lr_schedule: str = _setting(
        "constant", "After warm-up: constant, cosine decay to 0 at the end, step (x0.1 at "
        "1/2 and 3/4 of the epochs), or plateau (x --plateau_factor when --best_metric has "
        "not improved for --plateau_patience epochs).",
        choices=(*lr_schedules.AFTER_WARMUP, lr_schedules.PLATEAU))
    plateau_patience: int = _number(
        5, POSITIVE, "--lr_schedule=plateau: epochs without improvement of --best_metric "
        "(averaged over the workers) before the rate is lowered.")
    plateau_factor: float = _number(
        0.1, Range(0, 1, above=True), "--lr_schedule=plateau: what each lowering multiplies "
        "the rate by.")
    early_stopping_patience: int = _number(
        0, NON_NEGATIVE, "Stop training when --best_metric (averaged over the workers, so "
        "every rank stops at the same epoch) has not improved for this many epochs "
        "(0: never).")
    early_stopping_min_delta: float = _number(
        0.0, NON_NEGATIVE, "The least change of --best_metric that counts as an improvement "
        "for early stopping.")
    optimizer: str = _setting("sgd", "Optimizer, by its Keras name (keras.optimizers).",
                              choices=tuple(OPTIMIZERS))
    momentum: float = _number(0.9, Range(0, 1), "Momentum (sgd, rmsprop).")
    nesterov: bool = _setting(False, "Nesterov momentum (sgd).")
    weight_decay: float | None = _number(
        None, NON_NEGATIVE, "Decoupled weight decay, as Keras applies it: each update first "
        "takes weight x this x the learning rate off every weight (default: the optimizer's "
        "own, 0.004 for adamw, none for the others).")
    # Keras clips inside the update, which comes after the gradients' reduction:
    # every rank clips the same averaged gradients.
    clipnorm: float | None = _number(
        None, POSITIVE, "Clip each gradient, averaged over the workers, to this L2 norm.")
    global_clipnorm: float | None = _number(
        None, POSITIVE, "Clip the gradients, averaged over the workers, to this L2 norm "
        "taken over all of them.")
    clipvalue: float | None = _number(
        None, POSITIVE, "Clip each averaged gradient's values to [-this, this].")
    ema_momentum: float | None = _number(
        None, Range(0, 1), "Keep an exponential moving average of the weights with this "
        "momentum (Keras's use_ema); validation, hvdtrain evaluate and the exported model "
        "use the averaged weights.")
    seed: int = _number(0, Range(0, 2**32), "Random seed for weights and shuffling.")
    data_dir: str | None = _setting(
        None, "TFDS data directory (default: TFDS's, ~/tensorflow_datasets).")
    deterministic: bool = _setting(
        False, "Reproducible input order (tf.data's parallel stages keep order).")
    precision: str = _setting(
        "float32", "Keras dtype policy (mixed_float16 adds loss scaling).",
        choices=("float32", "mixed_float16", "mixed_bfloat16"))
    compression: str = _setting(
        "none", "Compression of the gradients on the wire.", choices=COMPRESSIONS)
    jit_compile: bool = _setting(
        False, "Compile the forward and backward pass and the optimizer's update with XLA, "
        "with Horovod's collectives between them, outside XLA.")
    steps_per_execution: int = _number(
        1, POSITIVE, "Training steps per call of the compiled train function (Keras's "
        "steps_per_execution; each step still reduces its gradients): less Python between "
        "steps. Callbacks act between calls, and an epoch's last call stops at its end.")
    tensor_parallel: int = _number(
        1, POSITIVE, "T: split the model's tensor-parallel layers over T consecutive ranks "
        "(a replica; inside a host), which read the same batch; the workers / T replicas are "
        "data-parallel, and --batch_size and the learning rate's scaling count replicas.")
    pipeline_parallel: int = _number(
        1, POSITIVE, "P: cut the model into P pipeline stages on P ranks of a replica (the "
        "outermost groups: across hosts), through which each batch runs as --microbatches "
        "micro-batches; the workers / (T x P) replicas are data-parallel.")
    microbatches: int = _number(
        0, NON_NEGATIVE, "--pipeline_parallel: the micro-batches M each batch is split into "
        "(0: 4 x P); --batch_size must be a multiple. The stages wait (P - 1) / (M + P - 1) "
        "of each step (the bubble).")
    pipeline_schedule: str = _setting(
        "1f1b", "--pipeline_parallel: the order of each stage's passes: 1f1b (one forward, "
        "one backward; at most P micro-batches' activations held) or gpipe (all forwards, "
        "then all backwards; M held).", choices=("1f1b", "gpipe"))
    pipeline_cuts: str = _setting(
        "", "--pipeline_parallel: the layers whose outputs end each stage but the last, "
        "P - 1 names separated by commas (empty: where the parameters split most evenly).")
    backward_passes_per_step: int = _number(
        1, POSITIVE, "Batches whose gradients accumulate locally per allreduce and update.")
    sparse_as_dense: bool = _setting(
        False, "Reduce embedding gradients densely instead of allgathering them.")
    # N groups are each negotiated and fused as one, started when the whole
    # group is ready: fewer collectives, which pays where communication shares
    # the CPU. 0 overlaps the allreduces with backprop: best on GPUs.
    allreduce_groups: int | None = _number(
        None, NON_NEGATIVE, "0: each gradient's allreduce starts as soon as it is computed "
        "(Horovod fuses those ready together); N: the gradients in N groups, each reduced as "
        "one when all of it is ready (fewer collectives). Default: 0 on GPUs and where the "
        "workers' threads (--intra_op_threads and Horovod's) leave a core free, else 1.")
    model_dir: str | None = _setting(
        None, "Where rank 0 writes checkpoints and the model (default runs/<recipe>).")
    resume: bool = _setting(
        False, "Go on from the newest intact checkpoint in --model_dir (if any).")
    checkpoint_epochs: int = _number(
        1, NON_NEGATIVE, "A checkpoint every this many epochs (0: only after the last).")
    checkpoint_steps: int = _number(
        0, NON_NEGATIVE,
        "Also a checkpoint every this many training steps (0: none within epochs).")
    keep_checkpoints: int = _number(
        3, NON_NEGATIVE, "Checkpoints kept: the newest this many, plus the best by "
        "--best_metric (0: write none).")
    best_metric: str = _setting(
        "val_loss", "The metric watched, averaged over the workers: its best checkpoint is "
        "kept, and early stopping and --lr_schedule=plateau decide on it (e.g. val_accuracy; "
        "empty: none).")
    nan_policy: str = _setting(
        "fail", "fail: stop every rank when the loss is NaN or infinite; ignore: train on.",
        choices=("fail", "ignore"))
    # A commit costs a few steps' time (copying the state to host memory, and
    # the host-update check's broadcast): every 50 keeps that small, while a
    # lost worker costs at most 50 steps again (less than the restart itself)
    # and a new host waits as long.
    elastic_commit_steps: int = _number(
        50, POSITIVE, "Under horovodrun's elastic mode: commit the training state every this "
        "many steps (and at each epoch's end); a lost worker costs the steps since the last "
        "commit, and added hosts join at the next one.")
    preemption_signals: str = _setting(
        preemption.DEFAULT_SIGNALS, "Signals that stop training cleanly: every rank stops "
        "after the same step, rank 0 writes a checkpoint of it, and the job exits with status "
        f"{preemption.EXIT_STATUS} (start it again with --resume); '' leaves signals their "
        "default action. Not under elastic mode, where a signalled worker is a lost one.")
    stall_timeout: float = _number(
        600.0, NON_NEGATIVE, "Seconds a rank waits for a hung peer before Horovod's stall "
        "check stops the job; hvdtrain's watchdog, over the whole run and under any controller, "
        "names the hung rank and stops the job after 3 times that; 0: never.")
    intra_op_threads: int = _number(
        0, NON_NEGATIVE, "Threads per op in each process (0: cores / local processes).")
    inter_op_threads: int = _number(
        0, NON_NEGATIVE, "Threads for independent ops (0: TensorFlow's default).")
    mpi_wait: str = _setting(
        "auto", "Under horovodrun --mpi, how a rank waits for its peers in a collective: "
        "'poll' spins on a core (the lowest latency), 'yield' gives the core to the host's "
        "other threads while it waits; 'auto' polls only where the workers' threads (each "
        "one's --intra_op_threads and Horovod's background thread) leave a core free, and "
        "keeps Open MPI's OMPI_MCA_mpi_yield_when_idle where the environment sets it.",
        choices=("auto", "poll", "yield"))
    verbose: int | None = _number(
        None, Range(0, 2, up_to=True), "Progress on rank 0: 0 none, 1 bar, 2 line per epoch "
        "(default: a bar for one process on a terminal, else 2).")
    export: bool = _setting(
        True, "Rank 0 writes the trained model (.keras and SavedModel) to --model_dir.")
    timeline_steps: str = _setting(
        "", "FIRST:LAST: record Horovod's timeline of those global training steps into "
        "--model_dir/timeline.json (chrome://tracing, ui.perfetto.dev).")
    profile_steps: str = _setting(
        "", "FIRST:LAST: rank 0 records TensorFlow's profiler over those global training "
        "steps into --model_dir/tensorboard (TensorBoard's profile tab).")
    verbose_all_ranks: bool = _setting(
        False, "Every rank shows its progress and logs, not only rank 0.")
    throughput_warmup_steps: int = _number(
        10, NON_NEGATIVE, "Training steps at the start of each fit left out of the throughput.")
    throughput_window_steps: int = _number(
        10, POSITIVE, "Training steps per throughput sample (the report: mean and 95% interval "
        "over samples).")
    # The recipe's own (Recipe.options), set by --option=NAME=VALUE
    options: dict = dataclasses.field(default_factory=dict)

    def override(self, **values):
        """A copy with some settings changed.

        Args:
            **values: Settings by field name; None keeps the current value.

        Returns:
            A new `TrainConfig` (not validated: call `validate`).

        Raises:
            UsageError: If a name is not a setting.
        """
        unknown = set(values) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise UsageError(f"unknown setting(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def recorded(self):
        """The settings as checkpoints and the run log keep them: every
        field, and what a recipe file holds (`recipe_digest`), by which a
        run is the same recipe's after the file moved."""
        return dict(dataclasses.asdict(self), recipe_digest=_recipe_digest(self.recipe))

    def same_recipe(self, recorded):
        """Whether the settings `recorded()` kept are of a run of this
        recipe: the same name or file, or a file of the same content."""
        digest = recorded.get("recipe_digest")
        return recorded.get("recipe") == self.recipe or (
            digest is not None and digest == _recipe_digest(self.recipe))

    def check_sharded_tables(self):
        """Refuses the settings that tables sharded across workers cannot
        follow (their sparse updates' rules, XLA) before any model is made:
        for the check of a recipe whose settings shard its tables.

        Raises:
            UsageError: Naming the setting and the way out.
        """
        # Here, not at the top: the flags are checked before TensorFlow loads.
        from hvdtrain.parallel import split_variables
        from hvdtrain.parallel.sharded_tables import sparse_updates

        if self.jit_compile:
            raise UsageError(split_variables.NO_XLA)
        sparse_updates.refuse(sparse_updates.problem(
            OPTIMIZERS[self.optimizer].keras_class,
            loss_scaling=self.precision == "mixed_float16",
            momentum=self.momentum,
            clipping_by_norm=self.clipnorm is not None or self.global_clipnorm is not None,
            ema=self.ema_momentum is not None, accumulating=self.backward_passes_per_step > 1))

    def validate(self):
        """Checks the settings as a whole: numbers in their ranges, names among
        their choices, settings that apply to the optimizer and the metric
        chosen, and `timeline_steps` and `profile_steps` well formed.

        Returns:
            This config, so that a call can end a chain.

        Raises:
            UsageError: Naming the first bad setting and how to fix it.
        """
        for field in dataclasses.fields(self):
            if "range" in field.metadata:
                _check_number(field, getattr(self, field.name))
        for field in dataclasses.fields(self):
            value, allowed = getattr(self, field.name), field.metadata.get("choices")
            if allowed and value not in allowed:
                raise UsageError(f"unknown --{field.name}={value}; "
                                 f"choose one of {', '.join(allowed)}")
        self._check_optimizer_settings()
        self._check_monitoring()
        self._check_tensor_parallel()
        self._check_pipeline_parallel()
        self.timeline_window()
        self.profile_window()
        preemption.parse_signals(self.preemption_signals)
        return self

    def timeline_window(self):
        """The steps `--timeline_steps` records.

        Returns:
            (first, last) global training steps, 1-based and inclusive; None
            when `timeline_steps` is empty.

        Raises:
            UsageError: If `timeline_steps` is not FIRST:LAST with
                1 <= FIRST <= LAST.
        """
        return _step_window("timeline_steps", self.timeline_steps)

    def profile_window(self):
        """The steps `--profile_steps` records, as `timeline_window`."""
        return _step_window("profile_steps", self.profile_steps)

    def _check_optimizer_settings(self):
        for name, optimizers in _OPTIMIZER_SETTINGS.items():
            field = next(f for f in dataclasses.fields(self) if f.name == name)
            if getattr(self, name) != field.default and self.optimizer not in optimizers:
                raise UsageError(f"--{name} applies to --optimizer={' or '.join(optimizers)}, "
                                 f"not {self.optimizer}")
        clipping = [name for name in CLIPPING if getattr(self, name) is not None]
        if len(clipping) > 1:
            raise UsageError(f"--{' and --'.join(clipping)} are both set; Keras clips one way: "
                             "keep one")

    def _check_tensor_parallel(self):
        """Refuses what the ranks of a replica, each holding parts of its
        weights, cannot do as one process would."""
        if self.tensor_parallel == 1:
            return
        refused = None
        if OPTIMIZERS[self.optimizer].keras_class in _WHOLE_WEIGHT_OPTIMIZERS:
            refused = (f"--optimizer={self.optimizer} updates each weight as a whole (its "
                       "norms or factors), which no rank holds; choose an optimizer that "
                       "updates element by element (sgd, adam, adamw, lion, ...)")
        elif self.clipnorm is not None or self.global_clipnorm is not None:
            refused = ("clipping by norm needs the norm of whole gradients, which no rank "
                       "holds; use --clipvalue")
        elif self.precision == "mixed_float16":
            refused = ("mixed_float16's loss scaling decides on each rank's parts of the "
                       "gradients, and ranks could decide differently; use "
                       "--precision=mixed_bfloat16")
        elif self.jit_compile:
            from hvdtrain.parallel import split_variables  # not at the top: before TensorFlow loads
            refused = split_variables.NO_XLA_TENSOR_PARALLEL
        if refused:
            raise UsageError(f"--tensor_parallel={self.tensor_parallel}: {refused}")

    def pipeline_microbatches(self):
        """M: the micro-batches of each batch (--microbatches, or 4 x P)."""
        return self.microbatches or 4 * self.pipeline_parallel

    def pipeline_cut_points(self):
        """The names of --pipeline_cuts, in order (empty: balanced)."""
        return [name.strip() for name in self.pipeline_cuts.split(",") if name.strip()]

    def _check_pipeline_parallel(self):
        """Refuses pipeline settings without a pipeline, cuts and
        micro-batches that do not fit it, and what stages that each hold a
        part of the model cannot do as one process would."""
        stages = self.pipeline_parallel
        if stages == 1:
            for name in ("microbatches", "pipeline_schedule", "pipeline_cuts"):
                field = next(f for f in dataclasses.fields(self) if f.name == name)
                if getattr(self, name) != field.default:
                    raise UsageError(f"--{name} applies to a pipeline: set "
                                     "--pipeline_parallel=P (P > 1) or leave it out")
            return
        cuts = self.pipeline_cut_points()
        microbatches = self.pipeline_microbatches()
        refused = None
        if cuts and len(cuts) != stages - 1:
            refused = (f"--pipeline_cuts names {len(cuts)} layer(s); {stages} stages end at "
                       f"{stages - 1}: name the layer that ends each stage but the last")
        elif self.batch_size % microbatches:
            refused = (f"--batch_size={self.batch_size} does not split into {microbatches} "
                       f"micro-batches{'' if self.microbatches else ' (4 x P by default)'}; "
                       f"make --batch_size a multiple of --microbatches")
        elif self.global_clipnorm is not None:
            refused = ("--global_clipnorm needs the norm of every gradient, and each stage "
                       "holds its own; use --clipnorm (per weight) or --clipvalue")
        elif self.precision == "mixed_float16":
            refused = ("mixed_float16's loss scaling would let each stage decide alone to "
                       "skip a step; use --precision=mixed_bfloat16")
        elif self.jit_compile:
            refused = ("XLA cannot hold the passes between stages (Horovod's alltoall); leave "
                       "--jit_compile off")
        if refused:
            raise UsageError(f"--pipeline_parallel={stages}: {refused}")

    def _check_monitoring(self):
        watching = [name for name, on in (
            ("early_stopping_patience", self.early_stopping_patience),
            ("lr_schedule=plateau", self.lr_schedule == lr_schedules.PLATEAU)) if on]
        if watching and not self.best_metric:
            raise UsageError(f"--{watching[0]} watches --best_metric, which is empty; set it "
                             "(e.g. --best_metric=val_loss)")


def _recipe_digest(recipe):
    """The SHA-256 of a recipe file's content; None for a recipe's name, or
    a file that cannot be read."""
    if not recipe.endswith(".py"):
        return None
    try:
        return hashlib.sha256(pathlib.Path(recipe).read_bytes()).hexdigest()
    except OSError:
        return None


def _step_window(name, text):
    """(first, last) of a FIRST:LAST window of global steps; None for ''."""
    if not text:
        return None
    first, colon, last = text.partition(":")
    try:
        steps = int(first), int(last)
    except ValueError:
        steps = None
    if not colon or steps is None or not 1 <= steps[0] <= steps[1]:
        raise UsageError(f"--{name}={text} is not FIRST:LAST with 1 <= FIRST <= LAST (global "
                         f"steps); e.g. --{name}=20:30")
    return steps


def _check_number(field, value):
    """A number of the field's type (an integer for an int field) in its range;
    None where the field's type allows it (unset: the default applies)."""
    if value is None and type(None) in typing.get_args(field.type):
        return
    kinds = (int,) if field.type is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "an integer" if field.type is int else "a number"
        raise UsageError(f"--{field.name} must be {expected}, got {value!r}")
    allowed = field.metadata["range"]
    if value not in allowed:
        raise UsageError(f"--{field.name} must be {allowed.describe()}, got {value}")
