"""The embedded speculative decoding engine: token ids in, token ids and per-step events out.

It knows nothing of text, files or workloads (see docs/engine.md).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.engine.engine import Batch, BatchStats, Engine, Generation

__getattr__, __dir__ = exports(__name__, {
    "Batch": "specbench.engine.engine",
    "BatchStats": "specbench.engine.engine",
    "Engine": "specbench.engine.engine",
    "Generation": "specbench.engine.engine",
})

__all__ = ["Batch", "BatchStats", "Engine", "Generation"]
