"""`specbench serve --capture static` with a static speculative_token_tree: the server's
continuous batch drafting and verifying trees on the static step gives every greedy request
the baseline's output, alone and at concurrency 8, streaming or not (test_serve_batching.py's
test, against this module's server)."""

from __future__ import annotations

from test_serve_batching import baseline, test_greedy_outputs_equal_the_baseline_alone_and_at_concurrency_8  # noqa: F401

SERVE_FLAGS = ("--capture static --speculative-config "
               "'{\"method\": \"draft_model\", \"model\": \"{draft}\", \"speculative_token_tree\": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}'")
