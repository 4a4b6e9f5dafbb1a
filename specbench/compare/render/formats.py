"""The file formats `specbench compare --format` / `--out FILE` write, by name and by suffix."""

from __future__ import annotations

from specbench.compare.render.json_doc import to_json
from specbench.compare.render.junit import to_junit
from specbench.compare.render.markdown import to_markdown

RENDERERS = {"json": to_json, "junit": to_junit, "markdown": to_markdown}
SUFFIX_FORMATS = {".json": "json", ".xml": "junit", ".md": "markdown", ".markdown": "markdown"}
