"""Backends turn `Request`s into `Result`s: the embedded engine (`embedded`), transformers'
generate() as a reference (`hf`) and OpenAI-compatible servers such as vLLM, SGLang or
`specbench serve` (`openai`, with `launcher` to start one per configuration). `base` states the
contract they share. They know nothing of records; `specbench.session` chooses and assembles
one."""

from specbench.backends.base import Backend, BatchedBackend, batched

__all__ = ["Backend", "BatchedBackend", "batched"]
