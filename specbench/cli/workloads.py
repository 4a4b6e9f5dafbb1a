"""`specbench workloads`: list the shipped prompt sets and preview any workload spec."""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from specbench.workload import list_workloads
from specbench.workload import load_workload

workloads_app = typer.Typer(
    help="List the shipped prompt sets and preview prompts of any set, file or hf: dataset.",
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(workloads_app, name="workloads")


def _sampling_text(sampling: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sampling.items()) if sampling else "-"


def _preview(text: str, width: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@workloads_app.command("list")
def list_cmd() -> None:
    """Show the named prompt sets: kind, prompt count, default sampling and description."""
    table = Table(title="Prompt sets (also: a .jsonl/.json/.parquet/.csv file or hf:NAME[:split])")
    for column in ("name", "kind", "count", "default sampling", "description"):
        table.add_column(column, overflow="fold")
    for info in list_workloads():
        count = "not installed" if info.count is None else str(info.count)
        table.add_row(info.name, info.kind, count, _sampling_text(info.default_sampling),
                      info.description)
    Console().print(table)


@workloads_app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="Named set, prompt file or hf:NAME[:split]."),
    num_prompts: Optional[int] = typer.Option(
        None, "--num-prompts", "-n", help="Show a seeded sample of this many prompts."),
    prompt_field: Optional[str] = typer.Option(
        None, "--prompt-field", help="Column holding the prompt (files and hf: datasets)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the --num-prompts sample."),
) -> None:
    """Show the prompts of a workload: id, category, per-prompt sampling and the first ~80
    characters of each prompt."""
    workload = load_workload(name, prompt_field=prompt_field, num_prompts=num_prompts, seed=seed)
    categories = sorted({p.category for p in workload.prompts})
    title = (f"{workload.name} ({workload.kind}): {len(workload.prompts)} prompts; default "
             f"sampling: {_sampling_text(workload.default_sampling)}")
    table = Table(title=title, caption=f"categories: {', '.join(categories)}")
    per_prompt = any(p.sampling for p in workload.prompts)
    table.add_column("id", overflow="fold")
    table.add_column("category")
    if per_prompt:
        table.add_column("sampling", overflow="fold")
    table.add_column("prompt", overflow="fold")
    for p in workload.prompts:
        row = [p.id, p.category]
        if per_prompt:
            row.append(_sampling_text(p.sampling))
        row.append(_preview(p.display_text))
        table.add_row(*row)
    Console().print(table)
