"""Acceptance counts, defined once (as vLLM's `SpecDecodingStats`) for every place that counts
them: the per-sample metrics (`specbench.metrics`), `specbench serve`'s /metrics counters and
per-request figures (`specbench.server`), and the OpenAI backend's pooled per-request and
/metrics figures (`specbench.backends.openai`).

vLLM's definitions:
- a *draft* is a verification step that proposed at least one draft token; plain decode steps
  (the baseline, an n-gram lookup that found nothing) do not count;
- acceptance rate = accepted / drafted tokens (None when nothing was drafted);
- mean acceptance length = 1 + accepted tokens / drafts, the bonus token included (None when
  nothing was drafted; a baseline reads 1.0 where a number is wanted);
- per-position acceptance[i] = drafts whose i-th token was accepted / drafts (acceptance is a
  prefix: a draft that accepted a tokens accepted positions 0..a-1);
- the acceptance histogram[j] = drafts that accepted exactly j tokens.

`PROMETHEUS` / `PER_POSITION` are vLLM's counter names for the same counts (prometheus_client
adds `_total` on exposition), shared by the server that writes them and the client that
reads them.

Boundary: counts and the ratios derived from them; no I/O, no pandas (the records-level
aggregations of many samples are `specbench.analysis` and `specbench.steps`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

# count field -> (vLLM's counter name, the HELP text `specbench serve` gives it)
PROMETHEUS: dict[str, tuple[str, str]] = {
    "num_drafts": ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    "num_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    "num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
}
# the per-position counter, labelled `position="i"`
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.")
COUNT_FIELDS = tuple(PROMETHEUS)


class _Step(Protocol):  # specbench.types.StepEvent, or anything with its two counts
    drafted: int
    accepted: int


@dataclass
class SpecDecodingStats:
    """Counts over drafts: totals, accepted tokens per position and the histogram of accepted
    counts (both lists grow to the longest draft seen, or start at `new(k)`'s width)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    acceptance_histogram: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def new(cls, num_spec_tokens: int = 0) -> "SpecDecodingStats":
        """Empty counts with positions 0..k-1 (and histogram 0..k) present from the start."""
        return cls(num_accepted_tokens_per_pos=[0] * num_spec_tokens,
                   acceptance_histogram=[0] * (num_spec_tokens + 1))

    def add_totals(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None:
        """Totals reported without per-step detail (a server's per-request counts)."""
        self.num_drafts += drafts
        self.num_draft_tokens += draft_tokens
        self.num_accepted_tokens += accepted_tokens

    def observe_accepted(self, accepted: int, proposed: int = 0, count: int = 1) -> None:
        """Positions and histogram of `count` drafts that each proposed `proposed` tokens and
        accepted the first `accepted` of them (totals untouched)."""
        width = max(accepted, proposed)
        if width > len(self.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos.extend([0] * (width - len(self.num_accepted_tokens_per_pos)))
        if width + 1 > len(self.acceptance_histogram):
            self.acceptance_histogram.extend([0] * (width + 1 - len(self.acceptance_histogram)))
        for i in range(accepted):
            self.num_accepted_tokens_per_pos[i] += count
        self.acceptance_histogram[accepted] += count

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verification step; a step that proposed nothing is not a draft."""
        if num_draft_tokens <= 0:
            return
        self.add_totals(1, num_draft_tokens, num_accepted_tokens)
        self.observe_accepted(num_accepted_tokens, num_draft_tokens)

    def observe_steps(self, steps: Iterable[_Step]) -> "SpecDecodingStats":
        for s in steps:
            self.observe_draft(s.drafted, s.accepted)
        return self

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def per_position_acceptance(self) -> list[float]:
        n = self.num_drafts
        return [x / n for x in self.num_accepted_tokens_per_pos] if n else []

    def to_dict(self) -> dict[str, Any]:
        """The counts and the derived figures, as run.json's `*_spec_decode` entries hold them."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
                "acceptance_rate": self.acceptance_rate,
                "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance}
