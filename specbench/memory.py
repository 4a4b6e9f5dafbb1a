"""Peak memory per measurement window.

CUDA: the caching allocator's peak (reset per window). CPU: the process's resident-set
high-water mark (VmHWM), which Linux lets a process reset by writing 5 to
/proc/self/clear_refs; where that is not possible the lifetime high-water mark
(ru_maxrss) is reported instead, which can only over-state a window's peak.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        pass


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
