"""The settings of one training run: recipe defaults, then user overrides,
checked as a whole before any process starts working."""

import dataclasses

from hvdtrain.errors import UsageError

OPTIMIZERS = ("sgd", "adam")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
COMPRESSIONS = ("none", "fp16", "bf16")
NAN_POLICIES = ("fail", "ignore")
LR_SCHEDULES = ("constant", "cosine", "step")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    recipe: str = "digits_cnn"
    epochs: int = 10
    batch_size: int = 32            # per worker: the global batch is size x this
    learning_rate: float = 0.01     # one worker's; scaled by the number of workers
    warmup_epochs: float = 2.0      # linear warm-up from one worker's rate to the scaled one
    # After warm-up: constant; cosine decay to 0 at the last epoch; or step:
    # x0.1 at half and again at three quarters of the epochs (He et al., 2016).
    lr_schedule: str = "constant"
    optimizer: str = "sgd"
    momentum: float = 0.9           # sgd only
    seed: int = 0
    data_dir: str | None = None     # TFDS data directory; None: TFDS's default
    deterministic: bool = False     # keep tf.data's parallel stages in order
    precision: str = "float32"      # a Keras dtype policy; mixed_float16 adds dynamic loss scaling
    compression: str = "none"       # of the gradients on the wire
    backward_passes_per_step: int = 1   # local gradient accumulation between allreduces
    sparse_as_dense: bool = False   # reduce embedding gradients densely instead of allgathering
    # 0: each gradient's allreduce starts as soon as backprop makes it, and
    # Horovod fuses those ready together (overlap: best on GPUs). N: N groups,
    # each negotiated and fused as one, started when the whole group is ready
    # (fewer collectives, which pays where communication shares the CPU).
    allreduce_groups: int = 0
    model_dir: str | None = None    # None: runs/<recipe>
    resume: bool = False            # go on from the newest intact checkpoint in model_dir
    checkpoint_epochs: int = 1      # a checkpoint every this many epochs (0: only after the last)
    checkpoint_steps: int = 0       # and every this many steps (0: none within epochs)
    keep_checkpoints: int = 3       # the newest this many, plus the best by best_metric (0: write none)
    best_metric: str = "val_loss"   # "": keep no best
    nan_policy: str = "fail"        # fail: stop all ranks when the loss is not finite
    # Under horovodrun's elastic mode: commit every this many steps (and at
    # each epoch's end). A commit costs about one to three steps of a small
    # model (copying the state, and the host-update check's broadcast): every
    # 50 keeps that to a few percent, while a lost worker costs at most 50
    # steps again (less than the restart itself) and a new host waits as long.
    elastic_commit_steps: int = 50
    stall_timeout: float = 600.0    # seconds waiting for a hung peer before the job stops (0: never)
    intra_op_threads: int = 0       # 0: host cores / processes on the host
    inter_op_threads: int = 0       # 0: TensorFlow's default
    verbose: int | None = None      # rank 0's progress; None: a bar on one process's terminal, else a line an epoch
    export: bool = True             # rank 0 writes the trained model (.keras and SavedModel)
    timeline_steps: str = ""        # "FIRST:LAST": Horovod's timeline of those global steps
    verbose_all_ranks: bool = False     # every rank shows its progress, not only rank 0
    throughput_warmup_steps: int = 10   # steps of each fit left out of the throughput
    throughput_window_steps: int = 10   # steps per throughput sample
    options: dict = dataclasses.field(default_factory=dict)  # the recipe's own (Recipe.options)

    def override(self, **values):
        """A copy with `values` set; None means keep the current value."""
        unknown = set(values) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise UsageError(f"unknown setting(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def validate(self):
        """Raises UsageError naming the first bad setting and how to fix it."""
        positive = ("epochs", "batch_size", "learning_rate", "backward_passes_per_step",
                    "elastic_commit_steps", "throughput_window_steps")
        for name in positive:
            if not getattr(self, name) > 0:
                raise UsageError(f"--{name} must be positive, got {getattr(self, name)}")
        for name in ("warmup_epochs", "intra_op_threads", "inter_op_threads",
                     "checkpoint_epochs", "checkpoint_steps", "stall_timeout",
                     "throughput_warmup_steps", "keep_checkpoints", "allreduce_groups"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name} must be >= 0, got {getattr(self, name)}")
        for name, allowed in (("optimizer", OPTIMIZERS), ("precision", PRECISIONS),
                              ("compression", COMPRESSIONS), ("nan_policy", NAN_POLICIES),
                              ("lr_schedule", LR_SCHEDULES)):
            if getattr(self, name) not in allowed:
                raise UsageError(f"unknown --{name}={getattr(self, name)}; "
                                 f"choose one of {', '.join(allowed)}")
        if not 0 <= self.momentum < 1:
            raise UsageError(f"--momentum must be in [0, 1), got {self.momentum}")
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
