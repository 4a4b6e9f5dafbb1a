"""Catalog heads for tests: parts written into a throwaway package on sys.path and an entry in
the catalog, both undone by the test's monkeypatch (how specbench ships its own heads, without
the real 53 MB)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from specbench.models import catalog, fetch
from specbench.models.catalog import CatalogEntry, PackagePart

PKG = "specbench_test_heads"  # the package the parts live in, importable only while a test runs


def package_dir(tmp_path: Path) -> Path:
    """Where `ship` puts PKG: a `site` directory under `tmp_path`."""
    return tmp_path / "site" / PKG


def register(tmp_path: Path, monkeypatch, name: str, paths: list[Path], size: int, sha: str,
             target: str = "tiny-target") -> CatalogEntry:
    """Make PKG under `tmp_path` importable and catalog head `name` the parts `paths` in it."""
    (package_dir(tmp_path) / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, PKG, raising=False)  # another test's PKG, from its own tmp_path
    entry = CatalogEntry(name=name, description="a tiny head", role="eagle3", target=target,
                         parts=tuple(PackagePart(PKG, f"{name}/{p.name}") for p in paths), size=size, sha256=sha,
                         recipe="tiny.make_head(seed=1)", measured="nothing")
    monkeypatch.setitem(catalog.CATALOG, name, entry)
    return entry


def ship(tmp_path: Path, monkeypatch, name: str, parts: list[bytes] | None = None, head_dir: Path | None = None,
         part_bytes: int = 40_000) -> CatalogEntry:
    """Catalog head `name`, its parts packed from `head_dir` (fetch.pack_head), or the raw
    `parts` given (to ship a broken archive)."""
    pkg = package_dir(tmp_path) / name
    pkg.mkdir(parents=True, exist_ok=True)
    if head_dir is not None:
        paths, size, sha = fetch.pack_head(head_dir, pkg, part_bytes=part_bytes)
    else:
        paths = []
        for i, chunk in enumerate(parts or [], 1):
            paths.append(pkg / f"part{i:02d}.bin")
            paths[-1].write_bytes(chunk)
        whole = b"".join(parts or [])
        size, sha = len(whole), hashlib.sha256(whole).hexdigest()
    return register(tmp_path, monkeypatch, name, paths, size, sha)
