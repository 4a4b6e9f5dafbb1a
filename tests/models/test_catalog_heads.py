"""EAGLE-3 heads in the catalog: a head directory packs into a reproducible .tar.xz split into
parts that ship inside a package; a pull joins, verifies and unpacks them into the cache, and the
head loads by its catalog name and drafts exactly as the directory it was packed from. Corrupt
parts and archives holding anything but the head's two files are refused in one line, with
nothing left behind. The head the default target ships with is checked against its entry."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest
import torch

import tiny
from head_fakes import PKG, package_dir, register, ship
from specbench.config import DEFAULT_EAGLE3_HEAD, DEFAULT_TARGET, default_draft
from specbench.errors import ModelError
from specbench.models import catalog, fetch, loading
from specbench.models.catalog import PackagePart
from specbench.models.eagle3 import load_head, read_head, save_head

V = 300


@pytest.fixture(scope="module")
def target():
    return tiny.make_model(vocab_size=V, layers=2, seed=0)


@pytest.fixture(scope="module")
def head_dir(target, tmp_path_factory) -> Path:
    head = tiny.make_head(target, draft_vocab_size=120, seed=1)
    return save_head(head, tmp_path_factory.mktemp("head") / "tiny-eagle3", speculative_tokens=3)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(fetch.CACHE_ENV, str(root))
    return root


def test_a_packed_head_pulls_by_name_and_loads_as_the_directory_it_came_from(head_dir, target, cache, tmp_path,
                                                                            monkeypatch):
    entry = ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    assert len(entry.parts) > 1  # split: parts of at most 40,000 bytes
    dest = fetch.pull("tiny-eagle3", progress=False)
    assert dest == cache / "models" / "tiny-eagle3" and fetch.is_converted(dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted([*fetch.HEAD_FILES, fetch.MARKER])
    for name in fetch.HEAD_FILES:  # byte for byte what was packed
        assert (dest / name).read_bytes() == (head_dir / name).read_bytes()
    assert list((cache / "archives").iterdir()) == []  # the parts stay in the package; no second copy
    by_name, by_dir = load_head("tiny-eagle3", target), load_head(head_dir, target)
    assert by_name.state_dict().keys() == by_dir.state_dict().keys()
    assert all(torch.equal(by_name.state_dict()[k], v) for k, v in by_dir.state_dict().items())
    # a second pull (and every load after it) uses the unpacked directory: nothing is assembled again
    monkeypatch.setattr(fetch, "assemble", lambda *a, **k: pytest.fail("assembled twice"))
    assert fetch.pull("tiny-eagle3", progress=False) == dest
    assert read_head("tiny-eagle3")[0].draft_vocab_size == 120


def test_packing_is_reproducible_and_parts_respect_their_size(head_dir, tmp_path):
    a = fetch.pack_head(head_dir, tmp_path / "a", part_bytes=30_000)
    b = fetch.pack_head(head_dir, tmp_path / "b", part_bytes=30_000)
    assert a[1:] == b[1:]  # same size and sha256
    assert [p.read_bytes() for p in a[0]] == [p.read_bytes() for p in b[0]]
    assert all(p.stat().st_size <= 30_000 for p in a[0]) and sum(p.stat().st_size for p in a[0]) == a[1]
    assert hashlib.sha256(b"".join(p.read_bytes() for p in a[0])).hexdigest() == a[2]
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(b"".join(p.read_bytes() for p in a[0])))) as tf:
        assert [(m.name, m.mtime, m.uid, m.uname) for m in tf.getmembers()] == [
            (n, 0, 0, "") for n in fetch.HEAD_FILES]


def test_a_corrupt_part_is_refused_in_one_line_and_nothing_is_unpacked(head_dir, cache, tmp_path, monkeypatch):
    entry = ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    part = tmp_path / "site" / PKG / entry.parts[1].member
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(fetch.CorruptModelError) as exc:
        fetch.pull("tiny-eagle3", progress=False)
    msg = str(exc.value)
    assert "tiny-eagle3" in msg and entry.sha256 in msg and f"ship inside {PKG}: reinstall it" in msg
    assert "\n" not in msg
    assert not (cache / "models" / "tiny-eagle3").exists() and list((cache / "archives").iterdir()) == []


def _archive(files: dict[str, bytes], kinds: dict[str, bytes] | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, link in (kinds or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, link.decode()
            tf.addfile(info)
    return lzma.compress(raw.getvalue())


@pytest.mark.parametrize("files, links, needle", [
    ({"config.json": b"{}", "model.safetensors": b"x", "../escape.py": b"print(1)"}, {}, "../escape.py"),
    ({"config.json": b"{}"}, {"model.safetensors": b"/etc/passwd"}, "expected exactly the files"),
    ({"config.json": b"{}"}, {}, "expected exactly the files"),
    (None, {}, "is not a readable head archive"),  # bytes that are not xz at all
])
def test_an_archive_holding_anything_but_the_heads_two_files_is_refused(cache, tmp_path, monkeypatch, files, links,
                                                                      needle):
    blob = _archive(files, links) if files is not None else b"not an xz stream" * 10
    ship(tmp_path, monkeypatch, "odd-eagle3", parts=[blob[:50], blob[50:]])
    with pytest.raises(ModelError) as exc:
        fetch.pull("odd-eagle3", progress=False)
    msg = str(exc.value)
    assert "odd-eagle3" in msg and needle in msg and "\n" not in msg
    assert not (cache / "models" / "odd-eagle3").exists()
    assert not (tmp_path / "escape.py").exists() and not (cache / "escape.py").exists()
    assert list((cache / "models").iterdir()) == [] and list((cache / "archives").iterdir()) == []


def test_a_write_that_fails_half_way_leaves_no_directory_behind(head_dir, cache, tmp_path, monkeypatch):
    ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    calls = []

    def full_disk(src, dst, length=0):
        calls.append(dst.name)
        if len(calls) == 2:  # the first file is written, the second fails
            raise OSError(28, "No space left on device")
        return real(src, dst, length)

    import shutil
    real = shutil.copyfileobj
    monkeypatch.setattr(shutil, "copyfileobj", full_disk)
    with pytest.raises(ModelError, match="not a readable head archive .*No space left on device"):
        fetch.pull("tiny-eagle3", progress=False)
    assert len(calls) == 2
    assert list((cache / "models").iterdir()) == [] and list((cache / "archives").iterdir()) == []
    monkeypatch.setattr(shutil, "copyfileobj", real)
    assert fetch.is_converted(fetch.pull("tiny-eagle3", progress=False))  # and the next pull does it all


def test_a_new_head_under_the_same_name_replaces_the_unpacked_one(target, cache, tmp_path, monkeypatch):
    """A specbench upgrade that retrains a head ships new parts under the same name: the marker's
    sha256 no longer matches the entry's, so the next pull unpacks the new head over the old."""
    old_dir = save_head(tiny.make_head(target, draft_vocab_size=120, seed=1), tmp_path / "old")
    new_dir = save_head(tiny.make_head(target, draft_vocab_size=90, seed=2), tmp_path / "new")
    ship(tmp_path / "v1", monkeypatch, "tiny-eagle3", head_dir=old_dir)
    assert read_head("tiny-eagle3")[0].draft_vocab_size == 120
    entry = ship(tmp_path / "v2", monkeypatch, "tiny-eagle3", head_dir=new_dir)
    assert not fetch.head_is_current(entry, cache / "models" / "tiny-eagle3")
    assert read_head("tiny-eagle3")[0].draft_vocab_size == 90
    assert json.loads((cache / "models" / "tiny-eagle3" / fetch.MARKER).read_text())["sha256"] == entry.sha256


def test_two_pulls_at_once_unpack_the_head_once(head_dir, cache, tmp_path, monkeypatch):
    import threading

    ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    unpacked, real = [], fetch.unpack_head

    def slow_unpack(*args):
        unpacked.append(threading.get_ident())
        threading.Event().wait(0.3)  # long enough for the other pull to reach the lock
        return real(*args)

    monkeypatch.setattr(fetch, "unpack_head", slow_unpack)
    results, errors = [], []

    def pull():
        try:
            results.append(fetch.pull("tiny-eagle3", progress=False))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [cache / "models" / "tiny-eagle3"] * 2
    assert len(unpacked) == 1  # the second pull found it unpacked once it had the lock
    assert list((cache / "archives").iterdir()) == []


def test_a_catalog_head_is_refused_on_another_catalog_target(head_dir, target, cache, tmp_path, monkeypatch):
    ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)  # trained for "tiny-target"
    with pytest.raises(ModelError) as exc:
        load_head("tiny-eagle3", target, target_name=DEFAULT_TARGET)
    msg = str(exc.value)
    assert "trained for tiny-target, not for the target " + DEFAULT_TARGET in msg and "--target tiny-target" in msg
    assert not (cache / "models" / "tiny-eagle3").exists()  # refused before it is unpacked
    load_head("tiny-eagle3", target, target_name="/models/a-local-copy")  # a path: its shapes decide


def test_servers_get_a_catalog_heads_directory_and_tokenizers_skip_it(head_dir, tiny_pair, cache, tmp_path,
                                                                      monkeypatch):
    from specbench.models.tokenizer import load_tokenizer_only
    from specbench.sweep.server import server_model_path

    ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    assert server_model_path("tiny-eagle3") == str(cache / "models" / "tiny-eagle3")  # what vLLM's "model" reads
    tok = load_tokenizer_only(None, fallbacks=["tiny-eagle3", str(tiny_pair[0])])  # a head holds no tokenizer
    assert tok.tokenizer is not None


def test_a_head_is_not_a_model_and_a_model_is_not_a_head(head_dir, cache, tmp_path, monkeypatch):
    ship(tmp_path, monkeypatch, "tiny-eagle3", head_dir=head_dir)
    with pytest.raises(ModelError) as exc:
        loading.resolve_model_path("tiny-eagle3")
    msg = str(exc.value)
    assert "EAGLE-3 head for tiny-target" in msg and "--method eagle3 --draft tiny-eagle3" in msg
    with pytest.raises(ModelError) as exc:  # refused before anything is fetched
        read_head(DEFAULT_TARGET)
    msg = str(exc.value)
    assert "catalog target model, not an EAGLE-3 head" in msg and DEFAULT_EAGLE3_HEAD in msg
    assert not (cache / "wheels").exists() and not (cache / "models" / "tiny-eagle3").exists()


def test_ship_head_stores_the_head_in_bf16_with_its_recipe_and_figures(head_dir, target, cache, tmp_path,
                                                                     monkeypatch):
    """benchmarks/ship_head.py writes what the catalog ships: bf16 weights (integer maps kept),
    the recipe and figures in config.json, parts a pull turns back into a head that loads."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ship_head", Path(__file__).parents[2] / "benchmarks" /
                                                  "ship_head.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    root = package_dir(tmp_path)
    parts, size, sha = mod.ship(head_dir, "tiny-eagle3", "recipe R", "figures F", out_root=root)
    assert [p.parent for p in parts] == [root / "tiny-eagle3"] * len(parts)
    register(tmp_path, monkeypatch, "tiny-eagle3", parts, size, sha)
    dest = fetch.pull("tiny-eagle3", progress=False)
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["specbench_catalog"] == {"name": "tiny-eagle3", "recipe": "recipe R", "measured": "figures F",
                                        "dtype": "bfloat16"}
    _, shipped = read_head(dest)
    _, original = read_head(head_dir)
    for key, value in original.items():
        if value.is_floating_point():
            assert shipped[key].dtype == torch.bfloat16 and torch.equal(shipped[key], value.to(torch.bfloat16))
        else:
            assert torch.equal(shipped[key], value)
    with pytest.raises(SystemExit, match="--head .*: no config.json"):
        mod.main(["--head", str(tmp_path), "--name", "x", "--recipe", "r", "--measured", "m"])


def test_models_pull_and_info_describe_a_catalog_head(head_dir, cache, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specbench.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    ship(tmp_path, monkeypatch, "tiny-head", head_dir=head_dir)  # a name that does not say what it is
    runner = CliRunner()
    before = runner.invoke(app, ["models", "info", "tiny-head"])
    assert before.exit_code == 0, before.output
    for text in ("eagle3", "tiny-target", "tiny.make_head(seed=1)", "nothing", "specbench models pull tiny-head",
                 f"{PKG} ("):
        assert text in before.output, text
    listed = runner.invoke(app, ["models", "list"])
    row = next(line for line in listed.output.splitlines() if "tiny-head" in line)
    assert listed.exit_code == 0 and [c.strip() for c in row.split("│") if c.strip()][:2] == ["tiny-head", "eagle3"]
    pulled = runner.invoke(app, ["models", "pull", "tiny-head", "--quiet"])
    assert pulled.exit_code == 0, pulled.output
    assert "EAGLE-3 head for tiny-target" in pulled.output and "draft vocabulary 120" in pulled.output
    assert "feature layers [0, 1, 2]" in pulled.output  # tiny.make_head's defaults
    after = runner.invoke(app, ["models", "info", "tiny-head"])
    assert after.exit_code == 0 and str(cache / "models" / "tiny-head") in after.output.replace("\n", "")
    assert "draft vocab size" in after.output and "120" in after.output


def test_method_eagle3_on_the_default_target_drafts_with_the_catalogs_head():
    assert default_draft(DEFAULT_TARGET, "eagle3", None) == DEFAULT_EAGLE3_HEAD
    assert default_draft(DEFAULT_TARGET, "eagle3", "/heads/mine") == "/heads/mine"
    assert default_draft("/models/other", "eagle3", None) is None  # other targets name their head
    assert default_draft(DEFAULT_TARGET, "ngram", None) is None
    assert [n for n in catalog.head_names() if catalog.get_entry(n).target == DEFAULT_TARGET] == [DEFAULT_EAGLE3_HEAD]
    from specbench.config import SpeculativeConfig
    from specbench.plan import RunPlan, _settle

    settled = _settle(RunPlan(speculative=SpeculativeConfig(method="eagle3"), ks=(2, 3)))  # `run --method eagle3`
    assert [(s.method, s.num_speculative_tokens, s.draft) for s in settled.specs] == [
        ("eagle3", 2, DEFAULT_EAGLE3_HEAD), ("eagle3", 3, DEFAULT_EAGLE3_HEAD)]


def test_the_shipped_head_matches_its_entry_and_is_the_default_targets(cache):
    """The real parts inside this installation: their bytes hash to the entry's sha256, each is
    small enough for any git host, and the head they unpack to was trained for the default
    target, on its layers, and says so (its training record and held-out figures)."""
    entry = catalog.get_entry(DEFAULT_EAGLE3_HEAD)
    assert entry.is_head and entry.target == DEFAULT_TARGET and entry.family == "qwen2.5"
    assert "train_eagle3.py" in entry.recipe and "held-out" in entry.measured
    from importlib import resources

    files = [resources.files(p.package).joinpath(p.member) for p in entry.parts]
    assert all(f.is_file() and len(f.read_bytes()) < 50 << 20 for f in files)
    assert hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest() == entry.sha256
    dest = fetch.pull(DEFAULT_EAGLE3_HEAD, progress=False)
    cfg, weights = read_head(dest)
    raw = json.loads((dest / "config.json").read_text())
    assert raw["speculators_config"]["verifier"]["name_or_path"] == DEFAULT_TARGET
    assert list(cfg.aux_layers) == [2, 14, 25] and cfg.target_hidden_size == 1536
    assert weights["fc.weight"].dtype == torch.bfloat16  # shipped in the dtype it trained under
    shipped = raw["specbench_catalog"]
    assert shipped["name"] == DEFAULT_EAGLE3_HEAD and shipped["measured"] == entry.measured
    assert shipped["recipe"] == entry.recipe
    assert len(raw["specbench_training"]["held_out"]) == 30  # the prompts `--num-prompts 30` measures


def test_every_shipped_part_is_package_data_and_the_wheel_stays_small():
    """A part that pyproject's package-data glob misses would be in the git tree but not in the
    wheel: an installed specbench could not pull its head. All parts together must leave the
    wheel under PyPI's default limit of 100 MB a file."""
    from fnmatch import fnmatch
    from importlib import resources

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"models/heads/*/part*.bin"' in pyproject
    shipped = [p for e in catalog.CATALOG.values() for p in e.parts if isinstance(p, PackagePart)]
    assert shipped  # the default target's head, at least
    for part in shipped:
        assert part.package == catalog.HEADS_PACKAGE and fnmatch(part.member, "*/part*.bin"), part
        assert part.member.count("/") == 1, part  # one directory per head, as the glob reads it
    total = sum(len(resources.files(p.package).joinpath(p.member).read_bytes()) for p in shipped)
    assert total < 90 << 20, f"{total:,} bytes of heads in the wheel"
