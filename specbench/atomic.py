"""Files written whole or not at all: `atomic_write` (temp file beside the target, fsync,
rename) with the permission bits the process umask gives any new file.

Boundary: bytes and paths only; records, sweeps, reports and model conversions all write
through it. The lowest layer: imports nothing of specbench.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Any, mode: int | None = None) -> None:
    """Call `write(fileobj)` on a binary temp file beside `path`, fsync it, then rename over
    `path`, with permission bits `mode` (default: what the process umask gives a new file,
    not mkstemp's 0600). A reader (or a crash) sees the old file or the new one, never a
    partial one."""
    if mode is None:
        mode = umask_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not possible on every platform, so best effort.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask_mode() -> int:
    """0666 minus the process umask: what open() would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _chmod_umask(path: Path, directory: bool = False) -> None:
    """Give `path` the mode open() (or mkdir(), for a directory) would have given it."""
    try:
        mode = umask_mode()
        os.chmod(path, (mode | (mode >> 2 & 0o111)) if directory else mode)
    except OSError:
        pass
