"""Prompt sets from files: JSONL, JSON, Parquet, CSV/TSV and `hf:` datasets (offline only).

Each row becomes one `Prompt`. The prompt is read from `--prompt-field` or, by default, from
the first of `PROMPT_FIELDS` / `CHAT_FIELDS` the row has. A string is the prompt text; a list
of message objects (OpenAI `role`/`content` or ShareGPT `from`/`value`) keeps the leading
system message(s) and the first user turn; a list of strings (MT-bench / Spec-Bench `turns`)
keeps the first turn. Optional columns: an id (`ID_FIELDS`), `category`, the sampling fields
of `SAMPLING_FIELDS` and structured output (specbench.structured.FIELDS). Rows whose prompt
is empty are skipped; anything else wrong raises `WorkloadError` naming the file, the row and
what is valid. The team's own sets in `workloads/` are read by the same code.
"""

from __future__ import annotations

import contextlib
import csv
import math
import gzip
import io
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from specbench.errors import WorkloadError
from specbench.structured import parse_structured
from specbench.workload.chat import chat_prompt
from specbench.workload.prompt import Prompt, is_missing, parse_sampling

PROMPT_FIELDS = ("prompt", "text", "question", "instruction", "input")
CHAT_FIELDS = ("messages", "conversations", "conversation", "turns")
ID_FIELDS = ("id", "question_id", "task_id", "prompt_id")
# file suffix -> format; ".gz" may follow the text formats
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
           ".csv": "csv", ".tsv": "tsv"}
HF_PREFIX = "hf:"



def file_format(path: Path) -> str | None:
    """The format of `path` from its suffix (`.jsonl`, `.csv.gz`, ...), or None."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
        if suffixes and suffixes[-1] == ".parquet":
            return None  # Parquet compresses itself
    return FORMATS.get(suffixes[-1]) if suffixes else None


def supported_suffixes() -> str:
    return ", ".join(FORMATS) + ", each but .parquet optionally .gz-compressed"


# --------------------------------------------------------------------------- row readers


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")  # a UTF-8 BOM (Excel's CSV) is not part of the first field


def _unreadable_json(exc: Exception) -> str:
    """What json could not read that is not a syntax error: nesting past the recursion limit, or
    an integer past Python's 4300-digit conversion limit."""
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply to read"
    return f"a number too long to read ({str(exc).split(':')[0]})"


def jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(`file:line`, object) of every non-blank line of a JSONL file (also .gz); a line that is
    not JSON is a WorkloadError naming it (prompt files, traces)."""
    with _open_text(path) as fp:
        for lineno, line in enumerate(fp, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); "
                                    "each line must be one JSON object") from None
            except (RecursionError, ValueError) as exc:
                raise WorkloadError(f"{where}: {_unreadable_json(exc)}; each line must be one JSON object") from None
            yield where, row


def _rows_json(path: Path) -> Iterator[tuple[str, Any]]:
    with _open_text(path) as fp:
        try:
            data = json.load(fp)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column "
                                f"{exc.colno})") from None
        except UnicodeDecodeError:
            raise  # iter_file_rows names the byte
        except (RecursionError, ValueError) as exc:
            raise WorkloadError(f"{path}: {_unreadable_json(exc)}; expected a JSON list of objects") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of objects, got a JSON "
                            f"{type(data).__name__}; use a list, or JSONL with one object a line")
    for i, row in enumerate(data):
        yield f"{path}: item {i}", row


def _rows_csv(path: Path, delimiter: str) -> Iterator[tuple[str, Any]]:
    csv.field_size_limit(2**31 - 1)  # long prompts (source texts) exceed the 128 KiB default
    with _open_text(path) as fp:
        reader = csv.DictReader(fp, delimiter=delimiter)
        try:
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row:
                    raise WorkloadError(f"{where}: row has more fields than the header "
                                        f"({', '.join(reader.fieldnames or [])})")
                yield where, row
        except csv.Error as exc:
            raise WorkloadError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None


def _rows_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise WorkloadError(f"{path}: not a readable Parquet file ({exc})") from None
    i = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path}: row {i}", row
            i += 1


def iter_file_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row) for every row of a prompt file; location is `file:line` where the
    format has lines, else `file: item N` / `file: row N`."""
    fmt = file_format(path)
    try:
        if fmt == "jsonl":
            yield from jsonl_rows(path)
        elif fmt == "json":
            yield from _rows_json(path)
        elif fmt in ("csv", "tsv"):
            yield from _rows_csv(path, "," if fmt == "csv" else "\t")
        elif fmt == "parquet":
            yield from _rows_parquet(path)
        else:
            raise WorkloadError(
                f"{path}: unsupported file extension; valid: {supported_suffixes()}")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (gzip.BadGzipFile, EOFError) as exc:
        raise WorkloadError(f"{path}: not a readable gzip file ({exc})") from None


# --------------------------------------------------------------------------- row -> Prompt


def _scalar(value: Any, where: str, field: str) -> str:
    """An id or category: a string or a number, never a list's or an object's repr."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise WorkloadError(f"{where}: field {field!r} must be a string or a number, got "
                            f"{type(value).__name__} {value!r}"[:300])
    if isinstance(value, float) and not math.isfinite(value):
        raise WorkloadError(f"{where}: field {field!r} must be a string or a finite number, got {value!r}")
    return str(value)


def _is_empty(value: Any) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, (list, tuple)) and not value)


def _find_prompt_field(row: Mapping[str, Any], where: str, prompt_field: str | None) -> str:
    if prompt_field is not None:
        if prompt_field not in row:
            raise WorkloadError(f"{where}: no field {prompt_field!r} (--prompt-field); fields "
                                f"present: {', '.join(map(str, row)) or 'none'}")
        return prompt_field
    present = [name for name in PROMPT_FIELDS + CHAT_FIELDS if name in row]
    for name in present:  # the first one with a value: datasets often have empty columns
        if not _is_empty(row[name]):
            return name
    if present:
        return present[0]  # all empty: the row is skipped
    raise WorkloadError(
        f"{where}: no prompt field; fields present: {', '.join(map(str, row)) or 'none'}; "
        f"expected one of {', '.join(PROMPT_FIELDS + CHAT_FIELDS)} or pass --prompt-field")


def row_to_prompt(row: Any, where: str, *, default_id: str, prompt_field: str | None = None,
                  default_category: str = "default") -> Prompt | None:
    """One row -> a Prompt, or None when its prompt is empty (the row is skipped)."""
    if not isinstance(row, Mapping):
        raise WorkloadError(f"{where}: expected an object with a prompt field, got "
                            f"{type(row).__name__}")
    name = _find_prompt_field(row, where, prompt_field)
    value = row[name]
    text: str | None
    messages: tuple[dict, ...] | None = None
    later: tuple[str, ...] = ()
    later_error: str | None = None
    if isinstance(value, str) and name in CHAT_FIELDS and value.lstrip().startswith("["):
        try:  # CSV cells hold chat lists as JSON text
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if value is None:
        return None
    if isinstance(value, str):
        text = value
        if name == "instruction" and isinstance(row.get("input"), str) and row["input"].strip():
            text = f"{value}\n\n{row['input']}"  # Alpaca: the input is the instruction's context
    elif isinstance(value, (list, tuple)):
        text, messages, later, later_error = chat_prompt(list(value), where, name)
    else:
        raise WorkloadError(f"{where}: field {name!r} must be a string, a list of messages or a "
                            f"list of turns, got {type(value).__name__}")
    if messages is None and (text is None or not text.strip()):
        return None

    id_field = next((f for f in ID_FIELDS if f in row and not is_missing(row[f])), None)
    pid = default_id if id_field is None else _scalar(row[id_field], where, id_field)
    category = row.get("category")
    category = default_category if is_missing(category) else _scalar(category, where, "category")
    return Prompt(id=pid, category=category, text=text, messages=messages,
                  sampling=parse_sampling(row, where), structured=parse_structured(row, where), later_turns=later,
                  later_error=later_error)


def prompts_from_rows(rows: Iterator[tuple[str, Any]], *, source: str, id_prefix: str,
                      prompt_field: str | None = None) -> list[Prompt]:
    """All non-empty prompts of `rows`; ids must be unique (they pair runs)."""
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    n_rows = 0
    for index, (where, row) in enumerate(rows):
        n_rows += 1
        prompt = row_to_prompt(row, where, default_id=f"{id_prefix}-{index}",
                               prompt_field=prompt_field)
        if prompt is None:
            continue
        if prompt.id in seen:
            raise WorkloadError(f"{where}: duplicate id {prompt.id!r} (first at "
                                f"{seen[prompt.id]}); ids must be unique")
        seen[prompt.id] = where
        prompts.append(prompt)
    if not prompts:
        detail = "no rows" if n_rows == 0 else f"all {n_rows} rows have an empty prompt"
        raise WorkloadError(f"{source}: empty prompt set ({detail})")
    return prompts


def load_file(path: Path, *, prompt_field: str | None = None) -> list[Prompt]:
    if not path.exists():
        raise WorkloadError(f"{path}: file not found")
    if path.is_dir():
        raise WorkloadError(f"{path}: is a directory; pass a prompt file ({supported_suffixes()}) "
                            f"or hf:{path} for a dataset directory")
    if not path.is_file():  # a FIFO would block the read until a writer comes, a device never ends
        raise WorkloadError(f"{path}: not a regular file (a FIFO, socket or device); pass a prompt file "
                            f"({supported_suffixes()})")
    if file_format(path) is None:
        raise WorkloadError(f"{path}: unsupported file extension; valid: {supported_suffixes()}")
    stem = path.name.split(".")[0] or "prompt"
    return prompts_from_rows(iter_file_rows(path), source=str(path), id_prefix=stem,
                             prompt_field=prompt_field)


# --------------------------------------------------------------------------- hf: datasets


def parse_hf_spec(spec: str) -> tuple[str, str | None, str | None]:
    """`hf:NAME[:split]` or `hf:NAME:config:split` -> (name, config, split)."""
    parts = spec[len(HF_PREFIX):].split(":")
    if not parts[0] or len(parts) > 3 or any(not p for p in parts[1:]):
        raise WorkloadError(f"{spec}: expected hf:NAME[:split] or hf:NAME:config:split "
                            "(NAME: a dataset id in the local cache or a local directory)")
    name = parts[0]
    config = parts[1] if len(parts) == 3 else None
    split = parts[-1] if len(parts) > 1 else None
    return name, config, split


@contextlib.contextmanager
def _hub_offline():
    """Force offline mode for the duration of a load, even when the environment does not ask
    for it: `hf:` reads only the local cache or a local directory, never the network.
    The flags are module constants read at call time, so patching them works after import."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    bars_were_on = not datasets.utils.are_progress_bars_disabled()
    verbosity = datasets.logging.get_verbosity()
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
        datasets.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


def _pick_split(spec: str, dsd: Any, split: str | None) -> Any:
    names = list(dsd.keys())
    if split is None:
        split = next((s for s in ("train", "test", "validation") if s in names), names[0])
    if split not in names:
        raise WorkloadError(f"{spec}: no split {split!r}; available: {', '.join(names)}")
    return dsd[split]


def load_hf(spec: str, *, prompt_field: str | None = None) -> list[Prompt]:
    """Rows of a dataset from the local Hugging Face cache or a local directory (one written
    by `save_to_disk`, or data files that `datasets.load_dataset` reads)."""
    name, config, split = parse_hf_spec(spec)
    local = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not local.is_dir():
        raise WorkloadError(f"{spec}: directory {name} not found; hf: takes a local dataset "
                            "directory or a dataset id in the local Hugging Face cache")
    with _hub_offline() as datasets:
        try:
            if local.is_dir() and ((local / "state.json").exists()
                                   or (local / "dataset_dict.json").exists()):
                ds = datasets.load_from_disk(str(local))  # written by save_to_disk
                ds = _pick_split(spec, ds, split) if isinstance(ds, datasets.DatasetDict) else ds
            else:
                ds = datasets.load_dataset(str(local) if local.is_dir() else name, config)
                ds = _pick_split(spec, ds, split)
        except WorkloadError:
            raise
        except Exception as exc:  # noqa: BLE001 - datasets raises many types for "not here"
            if local.is_dir():
                raise WorkloadError(
                    f"{spec}: directory {name} holds no dataset ({str(exc).splitlines()[0]}); "
                    "it must be written by save_to_disk or hold data files (.parquet, .jsonl, "
                    ".csv, ...)") from None
            if isinstance(exc, (ConnectionError, FileNotFoundError)):
                reason = (f"not in the local Hugging Face cache "
                          f"({datasets.config.HF_DATASETS_CACHE}) nor a local directory")
            else:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise WorkloadError(
                f"{spec}: dataset not available offline ({reason}); use a dataset already in "
                "the local Hugging Face cache, a local directory, or a prompt file") from None
    id_prefix = local.name if local.is_dir() else name.rsplit("/", 1)[-1]
    rows = ((f"{spec}: row {i}", row) for i, row in enumerate(ds))
    return prompts_from_rows(rows, source=spec, id_prefix=id_prefix, prompt_field=prompt_field)
