"""Tools: what tells a user about a machine or a run.

`hvdtrain doctor`, `hvdtrain report` and the run log it reads, the throughput
of a run (windows of steps, a 95% interval), and the strict check of
horovodrun's config file. Depend on runtime and errors; used by callbacks,
run and the command line.
"""
