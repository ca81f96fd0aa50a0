"""Where training stands: the position (the next batch of the next epoch),
the variables that make up the state there, and how a position maps onto a
run with another number of workers or batch size.

A checkpoint stores both; an elastic commit keeps both in memory.
"""

import dataclasses

__all__ = ["Position", "continue_at", "training_variables"]


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training resumes: the next batch of the next epoch, in a run of
    `workers` workers taking `steps` batches of `batch_size` per epoch."""
    epoch: int
    step: int
    steps: int
    workers: int
    batch_size: int

    @property
    def shown(self):
        """(epoch, step) as names and messages show a position, the way Keras
        counts epochs: epoch E, step S is the S-th step of the E-th epoch,
        done. The start is epoch 1, step 0; the end of the first epoch is
        epoch 1, step `steps`."""
        if self.step == 0 and self.epoch > 0:
            return self.epoch, self.steps
        return self.epoch + 1, self.step

    def describe(self):
        epoch, step = self.shown
        return f"epoch {epoch}, step {step} of {self.steps}"

    @property
    def name(self):
        epoch, step = self.shown
        return f"epoch-{epoch:04d}-step-{step:06d}"


def training_variables(model, optimizer=None):
    """Everything a checkpoint (or an elastic commit) holds, in a fixed order:
    the model's variables (weights, statistics, random generator states),
    then its optimizer's, or `optimizer`'s (step count, learning rate, slots,
    loss scale, accumulated gradients)."""
    return [*model.variables, *(optimizer or model.optimizer).variables]


def continue_at(saved, steps, workers, batch_size):
    """(epoch, step) in a run of `steps` batches of `batch_size` per worker
    that goes on from `saved`: the same point of the same epoch, counted in
    examples when the number of workers or the batch size changed (the
    epoch's order then differs: its shards are cut anew)."""
    if (saved.workers, saved.batch_size, saved.steps) == (workers, batch_size, steps):
        return saved.epoch, saved.step
    examples = saved.step * saved.workers * saved.batch_size
    # Rather a few examples twice than some not at all.
    step = min(examples // (workers * batch_size), steps)
    return (saved.epoch + 1, 0) if step == steps else (saved.epoch, step)
