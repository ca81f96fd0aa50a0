"""Faults: what keeps a job honest when something goes wrong.

The watchdog ends every rank when one stops making progress, naming it; the
launcher watch stops workers whose horovodrun is gone; preemption turns a
scheduler's signal into a checkpoint and exit 200; departures make the ranks
leave a run together and name a rank that failed, in its words, on the
board (the key-value store every rank reaches). They watch the process, not
the model, so they depend only on hvdtrain.errors: everything above
(runtime, which starts them, and training) may use them.
"""
