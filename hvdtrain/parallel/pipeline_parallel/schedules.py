"""The order in which a stage runs its micro-batches' forward and backward
passes within a training step.

    GPipe (Huang et al., 2019): every forward, then every backward. Stage s
        holds the activations of all M micro-batches at the turn.
    1F1B (PipeDream-Flush, Narayanan et al., 2021): P - s - 1 forwards to
        fill the pipeline, then one forward and one backward in turn, then
        the remaining backwards. The same bubble as GPipe, but a stage holds
        at most P - s micro-batches' activations: memory bounded by the
        pipeline's depth, not by M.

Both leave each stage idle for (P - 1) / (M + P - 1) of the step (the
bubble): more micro-batches shrink it.
"""

import dataclasses

__all__ = ["Action", "BACKWARD", "FORWARD", "SCHEDULES", "bubble", "few_microbatches", "gpipe",
           "one_forward_one_backward", "peak_stashed"]

FORWARD, BACKWARD = "forward", "backward"


@dataclasses.dataclass(frozen=True)
class Action:
    """One pass of one micro-batch through this stage."""
    kind: str          # FORWARD or BACKWARD
    microbatch: int


def gpipe(stages, microbatches, stage):
    """Stage `stage`'s actions under GPipe: all forwards, then all backwards."""
    del stages, stage  # the same order on every stage
    return ([Action(FORWARD, i) for i in range(microbatches)]
            + [Action(BACKWARD, i) for i in range(microbatches)])


def one_forward_one_backward(stages, microbatches, stage):
    """Stage `stage`'s actions under 1F1B: warm-up forwards, then a forward
    and a backward in turn, then the cool-down backwards."""
    warmup = min(stages - stage - 1, microbatches)
    actions = [Action(FORWARD, i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        actions += [Action(FORWARD, warmup + i), Action(BACKWARD, i)]
    return actions + [Action(BACKWARD, i) for i in range(microbatches - warmup, microbatches)]


SCHEDULES = {"1f1b": one_forward_one_backward, "gpipe": gpipe}


def peak_stashed(actions):
    """The most micro-batches whose activations the stage holds at once
    (forwarded, not yet backwarded)."""
    held = peak = 0
    for action in actions:
        held += 1 if action.kind == FORWARD else -1
        peak = max(peak, held)
    return peak


def bubble(stages, microbatches):
    """The fraction of a step each stage waits, in theory: (P - 1) / (M + P - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def few_microbatches(stages, microbatches):
    """What fewer micro-batches than stages cost, in words; None when there
    are enough."""
    if microbatches >= stages:
        return None
    return (f"{microbatches} micro-batches for {stages} stages: each stage waits "
            f"{bubble(stages, microbatches):.0%} of every step (the bubble; "
            f"{bubble(stages, 4 * stages):.0%} at {4 * stages} micro-batches)")
