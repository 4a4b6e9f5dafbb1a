"""Write a trained EAGLE-3 head as a catalog head: the parts that ship inside specbench.

Reads a head directory (what benchmarks/train_eagle3.py writes), stores its float weights in
--dtype (bfloat16: the dtype it trained under and runs in on a bf16 target; the engine casts a
head to its target's dtype when it loads it, so a float32 target computes with the same values),
records in its config.json under "specbench_catalog" the catalog name, how it was trained and
what it measured on held-out prompts, and packs config.json + model.safetensors into a
reproducible .tar.xz split into parts of at most --part-mb MiB under
specbench/models/heads/NAME/. Prints the size and sha256 the catalog entry must carry (the
entry in specbench/models/catalog.py repeats --recipe and --measured, so `specbench models info`
shows them without unpacking anything).

    python benchmarks/ship_head.py --head /work/heads/eagle3-answers3 \\
        --name qwen2.5-coder-1.5b-instruct-eagle3 --recipe "..." --measured "..."
    python benchmarks/ship_head.py --head DIR --name NAME   # the texts of NAME's catalog entry
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

from specbench.models import fetch

REPO = Path(__file__).resolve().parents[1]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def ship(head: Path, name: str, recipe: str, measured: str, dtype: str = "bfloat16", part_mb: int = 40,
         out_root: Path = REPO / "specbench" / "models" / "heads") -> tuple[list[Path], int, str]:
    """Pack `head` as catalog head `name` under `out_root`/`name`: (parts, size, sha256)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((head / "config.json").read_text())
    weights = load_file(head / "model.safetensors")
    weights = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in weights.items()}
    config["specbench_catalog"] = {"name": name, "recipe": recipe, "measured": measured, "dtype": dtype}
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        (staged / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(weights, staged / "model.safetensors")
        return fetch.pack_head(staged, out_root / name, part_bytes=part_mb << 20)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, required=True, help="the trained head's directory")
    ap.add_argument("--name", required=True, help="its catalog name, e.g. qwen2.5-coder-1.5b-instruct-eagle3")
    ap.add_argument("--recipe", help="how it was trained (the commands); default: the catalog entry's")
    ap.add_argument("--measured", help="what it measured on held-out prompts, with the command and the machine; "
                                       "default: the catalog entry's")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--part-mb", type=int, default=40, help="largest part, MiB (git hosts warn above 50)")
    args = ap.parse_args(argv)
    for f in fetch.HEAD_FILES:
        if not (args.head / f).is_file():
            sys.exit(f"--head {args.head}: no {f}; pass a head directory that benchmarks/train_eagle3.py wrote")
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", args.name):
        sys.exit(f"--name must be a catalog name of lowercase letters, digits, '.', '_' and '-' (it names a directory "
                 f"under specbench/models/heads/), got {args.name!r}")
    if not 1 <= args.part_mb <= 95:
        sys.exit(f"--part-mb must be in 1..95, got {args.part_mb}")
    if args.recipe is None or args.measured is None:  # the texts the entry already carries
        from specbench.models import catalog

        if not catalog.is_catalog_name(args.name) or not catalog.get_entry(args.name).is_head:
            sys.exit(f"--recipe and --measured: {args.name!r} is no catalog head yet, so give both")
        entry = catalog.get_entry(args.name)
        args.recipe = entry.recipe if args.recipe is None else args.recipe
        args.measured = entry.measured if args.measured is None else args.measured
    parts, size, sha = ship(args.head, args.name, args.recipe, args.measured, args.dtype, args.part_mb)
    print(f"{len(parts)} parts in {parts[0].parent}: size={size:_}, sha256={sha!r}")


if __name__ == "__main__":
    main()
