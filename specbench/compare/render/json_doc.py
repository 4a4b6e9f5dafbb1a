"""A comparison as a JSON document (NaN as null), for machines; written even when the runs are
not comparable (`comparable: false`, with the reasons).

Boundary: `Comparison` in, text out.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from specbench.compare.result import Comparison


def to_dict(c: Comparison) -> dict[str, Any]:
    """A JSON-ready dict of the comparison (NaN -> null)."""
    return {
        "outcome": c.outcome,
        "exit_code": c.exit_code,
        "comparable": c.comparable,
        "summary": c.summary(),
        "baseline": c.baseline,
        "current": c.current,
        "settings": c.settings,
        "reasons": c.reasons,
        "differences": c.differences,
        "unmatched_configurations": c.unmatched,
        "notes": c.notes,
        "results": [{**asdict(r), "failed": r.failed} for r in c.results],
    }


def to_json(c: Comparison) -> str:
    return json.dumps(to_dict(c), indent=2, default=str) + "\n"
