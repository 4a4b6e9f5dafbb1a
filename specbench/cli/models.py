"""`specbench models`: list the catalog, pull a model into the cache, describe a model.

A view over specbench.models: no fetching or loading logic lives here, only tables and
messages. Errors surface as SpecbenchError subclasses for the root app to print.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from specbench.models import catalog, fetch
from specbench.config import EngineConfig
from specbench.errors import ModelError

models_app = typer.Typer(
    help="List, pull and inspect models (catalog names, Hugging Face directories, .gguf files).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@models_app.command("list")
def list_models() -> None:
    """Show the catalog models and heads, their verified size and sha256, and whether they are cached."""
    # Converted models live at <cache>/models/<name>; the caption says where, so the table
    # stays narrow enough for an 80-column terminal.
    table = Table(title="catalog", caption=f"cached models: {fetch.cache_root() / 'models'}")
    table.add_column("name", no_wrap=True)
    for col in ("role", "size", "sha256", "cached"):
        table.add_column(col, no_wrap=True)
    for entry in catalog.CATALOG.values():
        cached = fetch.is_converted(fetch.converted_dir(entry.name))
        table.add_row(entry.name, entry.role, _size(entry.size), entry.sha256[:12],
                      "yes" if cached else "no")
    Console().print(table)


@models_app.command("pull")
def pull(
    name: str = typer.Argument(..., help="catalog name (see `specbench models list`) or a .gguf file"),
    check: bool = typer.Option(True, help="load the converted model once and report the time"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars"),
) -> None:
    """Download, assemble, verify and convert a model into the cache (once; later pulls are instant)."""
    from specbench.models import catalog, fetch, loading

    console = Console()
    started = time.perf_counter()
    path = Path(name).expanduser()
    if catalog.is_catalog_name(name) and not path.exists():
        dest = fetch.pull(name, progress=not quiet)
    elif path.is_file() and path.suffix.lower() == ".gguf":
        dest = fetch.convert_user_gguf(path, progress=not quiet)
    else:
        raise ModelError(
            f"cannot pull {name!r}; pass a catalog name ({', '.join(catalog.names())}) or a .gguf file"
        )
    console.print(f"[green]ready[/] {dest}  ({time.perf_counter() - started:.1f} s)", highlight=False)
    entry = fetch.named_head(name)
    if check and entry is not None:
        # Reading the head proves the directory is complete; it is checked against its target
        # when a run loads it.
        head = _head_summary(dest)
        console.print(f"EAGLE-3 head for {entry.target}: {head['parameters']:,} parameters, "
                      f"draft vocabulary {head['draft_vocab_size']:,}, feature layers {head['aux_layers']}",
                      highlight=False)
    elif check:
        # Loading once proves the directory is complete and shows what every run will pay.
        loaded = loading.load_model(str(dest), EngineConfig(device="cpu"))
        console.print(
            f"loads in {loaded.load_s:.1f} s ({str(loaded.dtype).removeprefix('torch.')}, cpu)",
            highlight=False,
        )


def _head_summary(path: Path) -> dict[str, Any]:
    """What an EAGLE-3 head directory holds (read, not fitted to a target)."""
    from specbench.models.eagle3 import build_head, describe, read_head

    cfg, weights = read_head(path)
    summary = describe(build_head(cfg, weights, path))
    summary["aux_layers"] = list(cfg.aux_layers or ())
    return summary


def _describe(path: Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """Config summary of a converted or Hugging Face directory, without loading weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from specbench.models import fetch, loading

    config_file = path / "config.json"
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{config_file}: not a readable model config ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{config_file}: not a model config (a JSON object), got a JSON {type(raw).__name__}")
    if raw.get("auto_map") and not trust_remote_code:
        raise ModelError(f"{path}: its config.json (auto_map) asks to run the repository's own code, which "
                         "specbench never does unless you pass --trust-remote-code")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        text = config.get_text_config()
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers fails on a broken directory in many ways
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path}: cannot read the model's config or tokenizer ({first})") from None
    loading.check_tokenizer(tokenizer, path, "models info")
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        gen = None
    weights = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    info: dict[str, Any] = {
        "path": str(path),
        "architecture": ", ".join(getattr(config, "architectures", None) or [config.model_type]),
        "layers": getattr(text, "num_hidden_layers", None),
        "hidden size": getattr(text, "hidden_size", None),
        "attention heads (q / kv)": f"{getattr(text, 'num_attention_heads', '?')} / "
                                    f"{getattr(text, 'num_key_value_heads', '?')}",
        "vocab (lm_head / tokenizer)": f"{text.vocab_size:,} / {len(tokenizer):,}",
        "dtype": str(getattr(config, "dtype", None) or "?").removeprefix("torch."),
        "eos ids": ", ".join(str(i) for i in loading.eos_ids(gen, tokenizer)),
        "max context": getattr(text, "max_position_embeddings", None),
        "tied embeddings": getattr(config, "tie_word_embeddings", None),
        "weights on disk": _size(weights) if weights else "-",
    }
    marker = path / fetch.MARKER
    if marker.is_file():
        source = json.loads(marker.read_text())
        info["converted from"] = source.get("catalog") or source.get("gguf")
    return info


def _describe_gguf(path: Path) -> dict[str, Any]:
    """Header summary of a .gguf file not converted yet (its metadata, no weights read)."""
    from gguf import GGUFReader


    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - a corrupt header fails in many ways
        raise ModelError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode(errors="replace") if f.types and f.types[0].name == "STRING" else value.tolist()[0]

    arch = field("general.architecture") or "?"
    return {"path": str(path), "architecture": arch, "layers": field(f"{arch}.block_count"),
            "hidden size": field(f"{arch}.embedding_length"), "max context": field(f"{arch}.context_length"),
            "tensors": len(reader.tensors), "file size": _size(path.stat().st_size),
            "converted": f"no: `specbench models pull {path}` (or the first run) converts it once"}


@models_app.command("info")
def info(
    name_or_path: str = typer.Argument(..., help="catalog name, Hugging Face directory or .gguf file"),
    trust_remote_code: bool = typer.Option(False, help="Allow a model repository's own config code to run."),
) -> None:
    """Summarize a model's configuration: architecture, layers, hidden size, vocab, dtype, eos ids."""
    from specbench.models import catalog, fetch, loading

    console = Console()
    table = Table(show_header=False, title=name_or_path)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    is_name = catalog.is_catalog_name(name_or_path) and not Path(name_or_path).exists()
    if is_name:
        entry = catalog.get_entry(name_or_path)
        table.add_row("description", entry.description)
        table.add_row("role", entry.role)
        if all(isinstance(p, catalog.PackagePart) for p in entry.parts):  # inside installed packages
            shipped = sorted({p.package for p in entry.parts})
            table.add_row("shipped in", f"{', '.join(shipped)} ({len(entry.parts)} parts)")
        else:
            table.add_row("packages", f"{entry.parts[0].requirement} ... ({len(entry.parts)} parts)"
                          if len(entry.parts) > 1 else entry.parts[0].requirement)
        table.add_row("head archive size" if entry.is_head else "gguf size", f"{entry.size:,} bytes")
        table.add_row("sha256", entry.sha256)
        if entry.is_head:
            for key, value in (("target", entry.target), ("trained with", entry.recipe),
                               ("measured", entry.measured)):
                table.add_row(key, value)
            dest = fetch.converted_dir(name_or_path)
            if fetch.is_converted(dest):
                table.add_row("path", str(dest))
                for key, value in _head_summary(dest).items():
                    table.add_row(key.replace("_", " "), f"{value:,}" if isinstance(value, int) and not
                                  isinstance(value, bool) else str(value))
            else:
                table.add_row("cached", f"no: run `specbench models pull {name_or_path}`")
            console.print(table)
            return
    file = Path(name_or_path).expanduser()
    try:
        path = loading.resolve_model_path(name_or_path, pull_missing=False)
    except ModelError:
        if file.is_file() and file.suffix.lower() == ".gguf":
            for key, value in _describe_gguf(file).items():
                table.add_row(key, str(value))
            console.print(table)
            return
        if not is_name:
            raise
        table.add_row("cached", f"no: run `specbench models pull {name_or_path}`")
        console.print(table)
        return
    for key, value in _describe(path, trust_remote_code).items():
        table.add_row(key, str(value))
    console.print(table)
