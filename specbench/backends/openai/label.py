"""The speculative configuration an OpenAI-compatible server runs, as the label of its
records. Speculation happens on the server, so the flags (--method/-k/--draft/
--speculative-config) only describe it: `specbench serve` states its configuration on its
/v1/models card (vLLM's JSON shape); vLLM's per-position counter on /metrics reveals k (not
the method). Declared values must agree with what the server reveals; a server that
speculates undeclared is refused.

Boundary: the card and the /metrics counters in, a `SpeculativeConfig` or a `ConfigError` out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specbench.config import DRAFTED_METHODS, SpeculativeConfig, parse_speculative_config
from specbench.errors import ConfigError


def served_spec(card: dict[str, Any], counters: dict[str, Any] | None, root: str, metrics_text_available: bool,
                method: str, ks: Sequence[int], draft: str | None, ngram: tuple[int, int],
                *, declared: bool) -> SpeculativeConfig:
    """`declared`: the user described the setup with --method/-k/--draft/--speculative-config.
    `counters`: the server's spec-decode counters when it was connected (None: none)."""
    card_cfg = card.get("speculative_config", "absent")
    positions = len(counters["num_accepted_tokens_per_pos"]) if counters else None
    if card_cfg != "absent":
        server = parse_speculative_config(json.dumps(card_cfg or {"method": "none"}))
    else:
        server = None
    if declared:
        if len(ks) != 1:
            raise ConfigError("--backend openai: a server runs one speculative configuration; pass one "
                              "-k value (launch one server per k)")
        if method in DRAFTED_METHODS and not draft and server is not None:
            draft = server.draft  # the card names the draft model (or heads)
        # suffix decoding's knobs: what the card states (the flags do not name them)
        knobs = {k: getattr(server, k) for k in ("suffix_decoding_max_tree_depth",
                                                  "suffix_decoding_max_cached_requests",
                                                  "suffix_decoding_max_spec_factor",
                                                  "suffix_decoding_min_token_prob")} \
            if server is not None and method == "suffix" else {}
        try:
            spec = SpeculativeConfig(method=method, num_speculative_tokens=ks[0] if method != "none" else 0,
                                     draft=draft if method in DRAFTED_METHODS else None,
                                     ngram_min=ngram[0], ngram_max=ngram[1], **knobs)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (with --backend openai these flags describe the server's setup)") from None
    else:
        if server is not None:
            return server
        if positions:
            raise ConfigError(
                f"{root} speculates with k={positions} (vllm:spec_decode_* in /metrics): "
                "describe it for the records with --method and --draft, or --speculative-config")
        return SpeculativeConfig()
    if server is not None and (server.method, server.num_speculative_tokens) != (
            spec.method, spec.num_speculative_tokens):
        raise ConfigError(f"the flags say {spec.short} but {root} serves {server.short} "
                          "(its /v1/models card)")
    if positions is not None and spec.speculative and positions != spec.num_speculative_tokens:
        raise ConfigError(f"-k {spec.num_speculative_tokens}: {root} drafts {positions} tokens per "
                          "step (vllm:spec_decode_num_accepted_tokens_per_pos in /metrics)")
    if metrics_text_available and positions is None and spec.speculative and card.get("owned_by") == "vllm":
        raise ConfigError(f"the flags say {spec.short} but {root} (vLLM) reports no "
                          "vllm:spec_decode_* counters: it does not speculate")
    return spec
