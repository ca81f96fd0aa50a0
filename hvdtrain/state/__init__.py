"""State: where training stands and how it is kept.

The position (epoch, step, examples seen), checkpoints of it and of the
variables, files that are whole or absent, the exported model, the model
directory and its one-job lock, and the state Horovod's elastic mode commits
and restores in memory. Depends on faults, runtime and parallel's collectives
and placement (a sharded table is saved whole); used by callbacks and run.
"""
