"""The embedded speculative decoding engine: token ids in, token ids and per-step events out.

It knows nothing of text, files or workloads (see docs/engine.md).
"""

from specbench.engine.engine import Batch, BatchStats, Engine, Generation

__all__ = ["Batch", "BatchStats", "Engine", "Generation"]
