"""Backends turn `Request`s into `Result`s: the embedded engine, transformers' generate()
as a reference, and (later) OpenAI-compatible servers. They know nothing of records."""

from specbench.backends.base import Backend

__all__ = ["Backend"]
