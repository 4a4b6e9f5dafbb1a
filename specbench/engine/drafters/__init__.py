"""Drafters propose up to k tokens per row per step for the target to verify (batch-first).

One file per method: `ngram` (prompt lookup), `draft_model` (a smaller model of the same
tokenizer), `eagle3` (a one-layer head over the target's own features), `medusa` (K heads
over the target's last hidden state), `suffix` (suffix trees over the request and, across
requests, over earlier outputs). `make_drafter` (`factory`) builds the one a `SpeculativeConfig` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.engine.drafters.base import Drafter, StatelessDrafter
    from specbench.engine.drafters.draft_model import DraftModelDrafter
    from specbench.engine.drafters.eagle3 import Eagle3Drafter
    from specbench.engine.drafters.factory import make_drafter
    from specbench.engine.drafters.medusa import MedusaDrafter
    from specbench.engine.drafters.ngram import NgramDrafter
    from specbench.engine.drafters.suffix import SuffixDrafter
    from specbench.engine.tree import Proposal, TreeShape

__getattr__, __dir__ = exports(__name__, {
    "Drafter": "specbench.engine.drafters.base",
    "Proposal": "specbench.engine.tree",
    "StatelessDrafter": "specbench.engine.drafters.base",
    "DraftModelDrafter": "specbench.engine.drafters.draft_model",
    "Eagle3Drafter": "specbench.engine.drafters.eagle3",
    "make_drafter": "specbench.engine.drafters.factory",
    "MedusaDrafter": "specbench.engine.drafters.medusa",
    "NgramDrafter": "specbench.engine.drafters.ngram",
    "SuffixDrafter": "specbench.engine.drafters.suffix",
    "TreeShape": "specbench.engine.tree",
})

__all__ = ["Drafter", "Proposal", "StatelessDrafter", "DraftModelDrafter", "Eagle3Drafter", "NgramDrafter",
           "MedusaDrafter", "SuffixDrafter", "TreeShape", "make_drafter"]
