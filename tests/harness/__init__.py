"""The harness of the ranked tests (tests/ranked): many test cases share one
`horovodrun` launch, and the ranks agree on every test's outcome.

The pytest session a developer starts (the dispatcher, dispatch.py) runs
each ranked test case inside a launch of `horovodrun -np N`, one per
controller and size (launches.py), where pytest runs on every rank
(rank_main.py, rank_plugin.py). After each phase of a test the ranks
exchange their reports through files (rendezvous.py): a failure on one rank
fails the test on all of them, and a rank that never arrives ends the
launch at the test's timeout, named. The dispatcher turns the reports rank 0
writes back into its own items' results, so the ranked cases appear, count
and time like any other test.
"""
