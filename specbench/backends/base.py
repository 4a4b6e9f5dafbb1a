"""The backend interface: one request in, one `Result` out, timed from its arrival."""

from __future__ import annotations

from typing import Protocol

from specbench.config import SpeculativeConfig
from specbench.types import Request, Result


class Backend(Protocol):
    name: str  # "embedded", "hf", ...
    device_name: str  # for the run metadata, e.g. "cpu (AMD EPYC, 2 threads)"

    def generate(self, request: Request, spec: SpeculativeConfig, *, arrival_time: float) -> Result:
        """Run one request to completion. `arrival_time` (perf_counter) is when it was queued."""
        ...
