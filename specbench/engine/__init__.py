"""The embedded speculative decoding engine: token ids in, token ids and per-step events out.

It knows nothing of text, files or workloads (see ARCHITECTURE.md).
"""

from specbench.engine.engine import Engine, Generation

__all__ = ["Engine", "Generation"]
