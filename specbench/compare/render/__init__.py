"""Renderers of a `Comparison`, one module per format (as GuideLLM's outputs/): `json_doc`,
`junit`, `markdown`, and `console` (a rich table); `cells` formats what they all show. A new
format is one module here and one entry in `RENDERERS` (text formats) and `SUFFIX_FORMATS`
(the `--output` file suffixes that pick it).
"""

from specbench.compare.render.cells import (ci_title, format_change, format_ci, format_threshold, format_value,
                                            format_verdict)
from specbench.compare.render.console import rich_table
from specbench.compare.render.json_doc import to_dict, to_json
from specbench.compare.render.junit import to_junit
from specbench.compare.render.markdown import to_markdown

RENDERERS = {"json": to_json, "junit": to_junit, "markdown": to_markdown}
SUFFIX_FORMATS = {".json": "json", ".xml": "junit", ".md": "markdown", ".markdown": "markdown"}

__all__ = ["RENDERERS", "SUFFIX_FORMATS", "ci_title", "format_change", "format_ci", "format_threshold",
           "format_value", "format_verdict", "rich_table", "to_dict", "to_json", "to_junit", "to_markdown"]
