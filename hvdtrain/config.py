"""The settings of one training run: recipe defaults, then user overrides,
checked as a whole before any process starts working."""

import dataclasses
import math

from hvdtrain.errors import UsageError

OPTIMIZERS = ("sgd", "adam")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
COMPRESSIONS = ("none", "fp16", "bf16")
NAN_POLICIES = ("fail", "ignore")
LR_SCHEDULES = ("constant", "cosine", "step")


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


def _number(default, allowed):
    """A numeric setting: its values are checked against `allowed`."""
    return dataclasses.field(default=default, metadata={"range": allowed})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    recipe: str = "digits_cnn"
    epochs: int = _number(10, POSITIVE)
    batch_size: int = _number(32, POSITIVE)  # per worker: the global batch is size x this
    # One worker's; scaled by the number of workers
    learning_rate: float = _number(0.01, POSITIVE)
    # Linear warm-up from one worker's rate to the scaled one
    warmup_epochs: float = _number(2.0, NON_NEGATIVE)
    # After warm-up: constant; cosine decay to 0 at the last epoch; or step:
    # x0.1 at half and again at three quarters of the epochs (He et al., 2016).
    lr_schedule: str = "constant"
    optimizer: str = "sgd"
    momentum: float = _number(0.9, Range(0, 1))  # sgd only
    seed: int = _number(0, Range(0, 2**32))
    data_dir: str | None = None     # TFDS data directory; None: TFDS's default
    deterministic: bool = False     # keep tf.data's parallel stages in order
    precision: str = "float32"      # a Keras dtype policy; mixed_float16 adds dynamic loss scaling
    compression: str = "none"       # of the gradients on the wire
    # Local gradient accumulation between allreduces
    backward_passes_per_step: int = _number(1, POSITIVE)
    sparse_as_dense: bool = False   # reduce embedding gradients densely instead of allgathering
    # 0: each gradient's allreduce starts as soon as backprop makes it, and
    # Horovod fuses those ready together (overlap: best on GPUs). N: N groups,
    # each negotiated and fused as one, started when the whole group is ready
    # (fewer collectives, which pays where communication shares the CPU).
    allreduce_groups: int = _number(0, NON_NEGATIVE)
    model_dir: str | None = None    # None: runs/<recipe>
    resume: bool = False            # go on from the newest intact checkpoint in model_dir
    # A checkpoint every this many epochs (0: only after the last)
    checkpoint_epochs: int = _number(1, NON_NEGATIVE)
    # And every this many steps (0: none within epochs)
    checkpoint_steps: int = _number(0, NON_NEGATIVE)
    # The newest this many, plus the best by best_metric (0: write none)
    keep_checkpoints: int = _number(3, NON_NEGATIVE)
    best_metric: str = "val_loss"   # "": keep no best
    nan_policy: str = "fail"        # fail: stop all ranks when the loss is not finite
    # Under horovodrun's elastic mode: commit every this many steps (and at
    # each epoch's end). A commit costs about one to three steps of a small
    # model (copying the state, and the host-update check's broadcast): every
    # 50 keeps that to a few percent, while a lost worker costs at most 50
    # steps again (less than the restart itself) and a new host waits as long.
    elastic_commit_steps: int = _number(50, POSITIVE)
    # Seconds waiting for a hung peer before the job stops (0: never)
    stall_timeout: float = _number(600.0, NON_NEGATIVE)
    intra_op_threads: int = _number(0, NON_NEGATIVE)  # 0: host cores / processes on the host
    inter_op_threads: int = _number(0, NON_NEGATIVE)  # 0: TensorFlow's default
    verbose: int | None = None      # rank 0's progress; None: a bar on one process's terminal, else a line an epoch
    export: bool = True             # rank 0 writes the trained model (.keras and SavedModel)
    timeline_steps: str = ""        # "FIRST:LAST": Horovod's timeline of those global steps
    verbose_all_ranks: bool = False     # every rank shows its progress, not only rank 0
    # Steps of each fit left out of the throughput
    throughput_warmup_steps: int = _number(10, NON_NEGATIVE)
    throughput_window_steps: int = _number(10, POSITIVE)  # steps per throughput sample
    options: dict = dataclasses.field(default_factory=dict)  # the recipe's own (Recipe.options)

    def override(self, **values):
        """A copy with `values` set; None means keep the current value."""
        unknown = set(values) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise UsageError(f"unknown setting(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def validate(self):
        """Raises UsageError naming the first bad setting and how to fix it."""
        for field in dataclasses.fields(self):
            if "range" in field.metadata:
                _check_number(field, getattr(self, field.name))
        for name, allowed in (("optimizer", OPTIMIZERS), ("precision", PRECISIONS),
                              ("compression", COMPRESSIONS), ("nan_policy", NAN_POLICIES),
                              ("lr_schedule", LR_SCHEDULES)):
            if getattr(self, name) not in allowed:
                raise UsageError(f"unknown --{name}={getattr(self, name)}; "
                                 f"choose one of {', '.join(allowed)}")
        self.timeline_window()
        if self.verbose not in (None, 0, 1, 2):
            raise UsageError(f"--verbose must be 0, 1 or 2, got {self.verbose}")
        return self

    def timeline_window(self):
        """(first, last) global steps of --timeline_steps (1-based, inclusive); None when off."""
        if not self.timeline_steps:
            return None
        first, colon, last = self.timeline_steps.partition(":")
        try:
            steps = int(first), int(last)
        except ValueError:
            steps = None
        if not colon or steps is None or not 1 <= steps[0] <= steps[1]:
            raise UsageError(f"--timeline_steps={self.timeline_steps} is not FIRST:LAST with "
                             "1 <= FIRST <= LAST (global steps); e.g. --timeline_steps=20:30")
        return steps


def _check_number(field, value):
    """A number of the field's type (an integer for an int field) in its range."""
    kinds = (int,) if field.type is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "an integer" if field.type is int else "a number"
        raise UsageError(f"--{field.name} must be {expected}, got {value!r}")
    allowed = field.metadata["range"]
    if value not in allowed:
        raise UsageError(f"--{field.name} must be {allowed.describe()}, got {value}")
