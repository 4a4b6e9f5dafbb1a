"""`specbench serve --capture static`: the server's continuous batch on the static step (rows
joining and leaving between steps, buckets growing and shrinking) gives every greedy request
the baseline's output, alone and at concurrency 8, streaming or not: the batching test of
test_serve_batching.py, against this module's server."""

from __future__ import annotations

from test_serve_batching import baseline, test_greedy_outputs_equal_the_baseline_alone_and_at_concurrency_8  # noqa: F401

SERVE_FLAGS = "--capture static"  # added to the `server` fixture's command (conftest)
