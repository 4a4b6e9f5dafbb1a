"""Run metadata (`RunMetadata`): the run configuration, versions, host, git revision,
command line and status that travel with every run as run.json; run ids and directories.

Boundary: what describes a run; writing and reading it is `specbench.records.files`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import platform
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata as _importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.config import RunConfig

if TYPE_CHECKING:
    pass


from specbench.records.schema import DEFAULT_RUNS_DIR, SCHEMA_VERSION

# --------------------------------------------------------------------------------------
# Run metadata


def package_version(name: str) -> str | None:
    # importlib.metadata, not `import torch`: reading a version must not load the library.
    try:
        return _importlib_metadata.version(name)
    except _importlib_metadata.PackageNotFoundError:
        return None


def _git_revision(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip()
    return rev if out.returncode == 0 and rev else None


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunMetadata:
    """Everything needed to interpret and reproduce a run; stored with its samples."""

    run_id: str
    created_at: str  # UTC, ISO 8601
    # The run configuration in its run.json form (`RunConfig.to_dict()`), kept as JSON here
    # because setup and the runner add to it as they go (`note`, `add_configuration_stats`);
    # `run_config` reads it back typed.
    config: dict[str, Any]
    versions: dict[str, str | None]  # specbench, torch, transformers, python
    device: str | None  # e.g. "NVIDIA H200" or "cpu (x86_64)"
    git_revision: str | None  # HEAD of the repository in the working directory, if any
    hostname: str
    command: list[str]  # the command line, argv style
    # running (the writer is open) | complete | interrupted (Ctrl-C, SIGTERM) | killed (read back
    # from the journal of a writer that never closed); only close(complete=True) says complete
    status: str = "interrupted"
    pid: int | None = None  # the writing process, to tell a running run from a killed one
    finished_at: str | None = None  # UTC, ISO 8601; set by RunWriter.close
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def collect(
        cls,
        run_id: str,
        config: RunConfig | dict[str, Any],
        *,
        device: str | None = None,
        command: list[str] | None = None,
        cwd: Path | None = None,
    ) -> "RunMetadata":
        """Gather versions, host, git revision and command line from the current process.
        `config` is a `RunConfig`, or a dict already in its JSON form (taken as it is)."""
        return cls(
            run_id=run_id,
            created_at=_utc_now(),
            config=config.to_dict() if isinstance(config, RunConfig) else config,
            versions={
                "specbench": package_version("specbench"),
                "torch": package_version("torch"),
                "transformers": package_version("transformers"),
                "python": platform.python_version(),
            },
            device=device,
            git_revision=_git_revision(cwd),
            hostname=socket.gethostname(),
            command=list(sys.argv if command is None else command),
        )

    @property
    def run_config(self) -> RunConfig:
        """The configuration, typed."""
        return RunConfig.from_dict(self.config)

    def note(self, **found: Any) -> None:
        """Add what setting up found or the run ended with, by `RunConfig` field name
        (`dtype_resolved=`, `engine=`, `openai=`, `eagle3_head=`, `interrupted_by=`, ...)."""
        unknown = set(found) - RunConfig.keys()
        assert not unknown, f"not RunConfig fields: {sorted(unknown)}"
        plain = RunConfig(**found).to_dict()  # the JSON form of each value
        self.config.update({name: plain[name] for name in found if name in plain})

    def add_configuration_stats(self, stats: dict[str, dict]) -> None:
        """Record (or replace) configurations' statistics, by configuration id."""
        self.config.setdefault("configuration_stats", {}).update(stats)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_run_id(config_short: str, now: _dt.datetime | None = None) -> str:
    """`<UTC yyyymmdd-HHMMSS>-<config_short>`, e.g. `20261129-101500-draft_model-k4`.
    Characters unsafe in a directory name become `_`."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", config_short).strip("._") or "run"
    return f"{now:%Y%m%d-%H%M%S}-{label}"


def default_run_dir(run_id: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """Where a run goes unless told otherwise: `runs/<run_id>`."""
    return Path(root) / run_id
