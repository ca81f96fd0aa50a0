"""Parallel: the ways training is split across workers, one sub-package each.

Here, what every strategy shares: collectives over Python values and Keras
variables, and the placement of variables split across workers (by rows, or
along an axis over a replica's ranks), whole for checkpoints and export.
`sharded_tables/` shards tables by rows; `tensor_parallel/` splits layers
over the ranks of a replica (hvdtrain.layout); `pipeline_parallel/` cuts a
model into stages; `data_parallel/` replicates the rest and reduces every
strategy's gradients over the data-parallel workers, so it sits above the
others. Depends on layout, runtime and errors; used by state, data,
callbacks, run and the public facades (hvdtrain.keras, hvdtrain.layers).
"""
