"""The cyclic garbage collector kept from stalling a client's event loop mid-stream, for the
backend's own loop (`client.OpenAIBackend.run`) and each `--client-processes` worker
(`workers`), which both import it.

A full collection of a process's heap (torch, transformers, pandas) took up to 71 ms, and of
a run's own chunks 42 ms at 256 streams, with the GIL held: so what exists is frozen, the
collector is off while requests are in flight, and the caller sweeps the young generations
every GC_SWEEP_S (a few ms each) so a long run's cycles stay bounded.

Boundary: the interpreter's collector only.
"""

from __future__ import annotations

import gc

GC_SWEEP_S = 10.0  # during a run, the young generations are collected this often


def quiet_collector() -> bool:
    """Collect once, freeze what exists (the collector never walks it again) and switch
    automatic collection off; the caller sweeps the young generations every GC_SWEEP_S.
    Returns whether it was enabled."""
    gc.collect()
    gc.freeze()
    was = gc.isenabled()
    gc.disable()
    return was
