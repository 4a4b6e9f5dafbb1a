"""Reading a sweep spec file (TOML, usually in `sweeps/`) into {"section.key": value}.

Syntax errors, unknown sections or keys (the valid ones listed) and values of the wrong
type are one-line `ConfigError`s naming file:line. Boundary: the file only; merging with
flags and checking what the values mean is `specbench.sweep.spec.build_spec`'s.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from specbench.errors import ConfigError
from specbench.sweep.options import DEFAULT_SWEEPS_DIR, SECTIONS, check_type, keys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _toml_error_line(exc: Exception, text: str) -> int:
    line = getattr(exc, "lineno", None)
    if isinstance(line, int):
        return line
    m = re.search(r"at line (\d+)", str(exc))
    if m:
        return int(m.group(1))
    return max(1, text.count("\n") + (0 if text.endswith("\n") else 1))  # "at end of document"


def load_spec_file(path: Path | str) -> dict[str, Any]:
    """Parse a sweep spec file into {"section.key": value}; check sections and keys."""
    path = Path(path)
    if not path.is_file():
        shipped = sorted(p.name for p in DEFAULT_SWEEPS_DIR.glob("*.toml"))
        hint = f"; specs in {DEFAULT_SWEEPS_DIR}/: {', '.join(shipped)}" if shipped else ""
        raise ConfigError(f"sweep spec {path} not found{hint}")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = getattr(exc, "msg", None) or re.sub(r"\s*\((at line|at end).*\)$", "", str(exc))
        raise ConfigError(f"{path}:{_toml_error_line(exc, text)}: invalid TOML: {msg}") from None
    except RecursionError:  # thousands of nested arrays or tables: tomllib recurses per level
        raise ConfigError(f"{path}: invalid TOML: arrays or tables nested too deep for a sweep spec "
                          "(its values are flat: strings, numbers, lists of them)") from None
    flat: dict[str, Any] = {}
    for section, body in data.items():
        if section not in SECTIONS:
            # (no square brackets in messages: the CLI prints them through rich markup)
            raise ConfigError(f"{path}:{_line_of(text, section, None)}: unknown section {section!r}; "
                              f"valid sections: {', '.join(SECTIONS)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}:{_line_of(text, None, section)}: {section!r} must be a "
                              "table (a section header)")
        for key, value in body.items():
            if key not in keys(section):
                raise ConfigError(f"{path}:{_line_of(text, section, key)}: unknown key {key!r} in "
                                  f"section {section!r}; valid keys: {', '.join(keys(section))}")
            check_type(f"{section}.{key}", value, f"{path}:{_line_of(text, section, key)}: ")
            flat[f"{section}.{key}"] = value
    return flat


def _line_of(text: str, section: str | None, key: str | None) -> int:
    """Best-effort line number of `[section]` or of `key = ...` within it (for messages)."""
    lines = text.splitlines()
    start = 0
    if section is not None:
        for i, line in enumerate(lines):
            if re.match(rf"\s*\[\s*{re.escape(section)}\s*\]", line):
                start = i
                if key is None:
                    return i + 1
                break
    if key is not None:
        for i in range(start, len(lines)):
            if re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", lines[i]):
                return i + 1
    return start + 1
