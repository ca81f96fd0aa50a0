"""Data parallelism: every worker holds the model and trains on its own
shard; the distributed optimizer (and the tape) average the gradients with
Horovod's allreduce before each update, with its reduction and compression
options; exact evaluation sums metric states over the workers, and the
statistics workers keep of their own batches are averaged.

The optimizer applies the rows of tables sharded by parallel.sharded_tables, so it
may depend on that strategy; no strategy depends on it.
"""
