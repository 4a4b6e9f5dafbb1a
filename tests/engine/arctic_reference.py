"""Run in Arctic Inference's own virtualenv (never specbench's): reads a JSON job on stdin,
answers each query with arctic_inference.suffix_decoding.SuffixDecodingCache.speculate, writes
JSON to stdout. Used by tests/engine/test_suffix_arctic.py."""

import json
import sys

from arctic_inference.suffix_decoding import SuffixDecodingCache

job = json.load(sys.stdin)
cache = SuffixDecodingCache(max_tree_depth=job["depth"], max_cached_requests=job["max_cached"])
for i, out in enumerate(job["earlier"]):  # earlier requests: their outputs fill the global tree
    cache.start_request(f"old{i}", job["earlier_prompts"][i])
    cache.add_active_response(f"old{i}", out)
    cache.stop_request(f"old{i}")
answers = []
for q in job["queries"]:
    rid = f"q{len(answers)}"
    cache.start_request(rid, q["prompt"])
    if q["output"]:
        cache.add_active_response(rid, q["output"])
    d = cache.speculate(rid, q["prompt"] + q["output"], max_spec_tokens=q["k"],
                        max_spec_factor=job["factor"], min_token_prob=job["min_prob"])
    answers.append({"tokens": list(d.token_ids), "probs": list(d.probs), "score": d.score,
                    "match_len": d.match_len})
    cache.stop_request(rid)  # its output stays in the global tree, as a finished request's
json.dump(answers, sys.stdout)
