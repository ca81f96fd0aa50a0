"""Each rank's share of fixed global batches, for workers that compare a
run at np=2 with one at np=1 on the same global batches."""

import numpy as np

import hvdtrain


def rank_rows(steps, global_batch):
    """The rows this rank trains on, in order, when `steps` global batches of
    `global_batch` consecutive rows are split evenly over the ranks: rank r
    takes the r-th part of each."""
    share = global_batch // hvdtrain.size()
    return np.concatenate([np.arange(s * global_batch + hvdtrain.rank() * share,
                                     s * global_batch + (hvdtrain.rank() + 1) * share)
                           for s in range(steps)])
