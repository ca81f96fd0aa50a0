"""Rank-aware tests: each runs on every rank of a shared horovodrun launch
(see tests/harness)."""

from harness.fixtures import *  # noqa: F401,F403
