"""Renderers of a `Comparison`, one module per format (as GuideLLM's outputs/): `json_doc`,
`junit`, `markdown`, and `console` (a rich table); `cells` formats what they all show. A new
format is one module here and one entry in `RENDERERS` (text formats) and `SUFFIX_FORMATS`
(the `--output` file suffixes that pick it).
"""

from typing import TYPE_CHECKING

from specbench.lazy import exports

if TYPE_CHECKING:  # the names below, for readers and type checkers; each loads on first use
    from specbench.compare.render.cells import (ci_title, format_change, format_ci, format_threshold, format_value,
                                                format_verdict)
    from specbench.compare.render.console import rich_table
    from specbench.compare.render.formats import RENDERERS, SUFFIX_FORMATS
    from specbench.compare.render.json_doc import to_dict, to_json
    from specbench.compare.render.junit import to_junit
    from specbench.compare.render.markdown import to_markdown

__getattr__, __dir__ = exports(__name__, {
    **dict.fromkeys(("ci_title", "format_change", "format_ci", "format_threshold", "format_value",
                     "format_verdict"), "specbench.compare.render.cells"),
    "rich_table": "specbench.compare.render.console",
    "RENDERERS": "specbench.compare.render.formats",
    "SUFFIX_FORMATS": "specbench.compare.render.formats",
    "to_dict": "specbench.compare.render.json_doc",
    "to_json": "specbench.compare.render.json_doc",
    "to_junit": "specbench.compare.render.junit",
    "to_markdown": "specbench.compare.render.markdown",
})

__all__ = ["RENDERERS", "SUFFIX_FORMATS", "ci_title", "format_change", "format_ci", "format_threshold",
           "format_value", "format_verdict", "rich_table", "to_dict", "to_json", "to_junit", "to_markdown"]
