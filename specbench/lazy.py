"""Lazy re-exports for a package's `__init__` (PEP 562).

A package re-exports its public names (`from specbench.report import build_report`) without
importing its submodules when it is imported: the name's module loads on first use. So a
submodule importing a sibling (`from specbench.report.fmt import ...`, which imports the
package first) never runs the package's other submodules, and no import circle forms through
an `__init__` (tests/test_layers.py refuses circles). The package lists the names beside a
`TYPE_CHECKING` block with the plain imports, for readers and type checkers.

Boundary: importlib only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: `names` maps each public name to the module
    that defines it; a name is imported, and kept on the package, when first read."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
