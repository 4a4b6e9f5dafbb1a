"""A model's tokenizer without its weights: what `specbench run --backend openai` needs of the
target to build requests and count tokens when a server holds the model.

The tokenizer comes from `source` (--tokenizer / --target), else from the first of
`fallbacks` (the served model name, its card's `root`) that is a local directory or a catalog
name. Catalog models are pulled if missing (the tokenizer ships inside the model files); a
tokenizer-only directory needs no config.json; weights are never loaded. The context length
is the server's `max_model_len` when it states one, else the model config's
`max_position_embeddings` capped by the tokenizer's `model_max_length`.

Boundary: local files in, a tokenizer out; no HTTP (the OpenAI backend passes what the
server's card says).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.errors import ConfigError, ModelError
from specbench.models import catalog, fetch


@dataclass
class TokenizerOnly:
    """What `specbench run` needs of the target for an HTTP backend: no weights."""

    name: str
    path: Path
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    max_context: int | None


def load_tokenizer_only(source: str | None, *, fallbacks: Sequence[str | None] = (),
                        served_max_context: Any = None, missing_hint: str = "",
                        trust_remote_code: bool = False) -> TokenizerOnly:
    """The tokenizer from `source` or the first usable of `fallbacks` (see the module
    docstring); ConfigError with `missing_hint` when there is none."""
    from transformers import AutoTokenizer, GenerationConfig

    from specbench.models.loading import check_tokenizer, eos_ids, resolve_model_path

    def usable(spec: str | None) -> bool:
        return bool(spec) and (Path(spec).expanduser().exists()
                               or (catalog.is_catalog_name(spec) and fetch.named_head(spec) is None))

    if source is None:
        source = next((s for s in fallbacks if usable(s)), None)
        if source is None:
            raise ConfigError(missing_hint or "no tokenizer source: pass --tokenizer")
    path = Path(source).expanduser()
    if not (path.is_dir() and not (path / "config.json").is_file()):
        path = resolve_model_path(source)  # a tokenizer-only directory needs no config.json
    try:
        with fetch.quiet_transformers_progress():
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise ModelError(f"tokenizer {source!r}: could not load from {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    check_tokenizer(tok, path, f"tokenizer {source!r}")
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        gen = None
    max_context = served_max_context
    if not isinstance(max_context, int) or max_context <= 0:
        max_context = None
        cfg = path / "config.json"
        if cfg.is_file():
            try:
                c = json.loads(cfg.read_text())
                c = c.get("text_config", c)
                max_context = int(c.get("max_position_embeddings") or 0) or None
            except (ValueError, TypeError):
                pass
        tok_max = getattr(tok, "model_max_length", None)
        if isinstance(tok_max, int) and 0 < tok_max < 10**8:
            max_context = min(max_context, tok_max) if max_context else tok_max
    return TokenizerOnly(name=str(source), path=path, tokenizer=tok, eos_token_ids=eos_ids(gen, tok),
                         max_context=max_context)
