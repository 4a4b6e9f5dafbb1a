"""Drafters propose up to k tokens per step for the target to verify.

A drafter returns the proposed ids and the distributions q they were drawn from (None for a
deterministic drafter, whose q is one-hot). It keeps whatever state it needs per sequence
and is told, after each verification, how much of the sequence is still valid.
"""

from specbench.engine.drafters.base import Drafter, Proposal
from specbench.engine.drafters.draft_model import DraftModelDrafter
from specbench.engine.drafters.ngram import NgramDrafter

__all__ = ["Drafter", "Proposal", "DraftModelDrafter", "NgramDrafter"]
