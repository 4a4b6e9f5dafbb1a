"""The flags `run`, `serve` and `sweep` share are declared once (`specbench.flags`): the same
help in all three, and the same default where the meaning is the same."""

from __future__ import annotations

import click
import pytest
import typer

from specbench.cli import app
from specbench.flags import HELP

SHARED = {"target": "--target", "device": "--device", "dtype": "--dtype", "onednn": "--onednn", "capture": "--capture",
          "trust_remote_code": "--trust-remote-code"}
COMMANDS = ("run", "serve", "sweep")


def commands() -> dict[str, click.Command]:
    group = typer.main.get_command(app)
    return {name: group.commands[name] for name in COMMANDS}  # type: ignore[attr-defined]


def flag(command: click.Command, name: str) -> click.Parameter | None:
    return next((p for p in command.params if name in getattr(p, "opts", [])), None)


def disagreements(cmds: dict[str, click.Command], key: str, name: str) -> list[str]:
    """What differs between the commands' declarations of one shared flag (empty: nothing)."""
    found = {c: flag(cmd, name) for c, cmd in cmds.items()}
    out = [f"{c} has no {name}" for c, p in found.items() if p is None]
    out += [f"{c}: help {p.help!r}" for c, p in found.items() if p is not None and p.help != HELP[key]]
    # sweep's options take their values as text (a spec file can hold them too)
    defaults = {str(p.default).lower() for c, p in found.items() if p is not None and c != "sweep"}
    if len(defaults) > 1:
        out.append(f"defaults {sorted(defaults)}")
    return out


@pytest.mark.parametrize("key,name", sorted(SHARED.items()))
def test_a_shared_flag_has_one_help_and_one_default_in_run_serve_and_sweep(key, name):
    assert disagreements(commands(), key, name) == []


def test_speculative_config_reads_the_same_in_run_and_serve():
    cmds = commands()
    assert flag(cmds["run"], "--speculative-config").help == flag(cmds["serve"], "--speculative-config").help \
        == HELP["speculative_config"]


def test_the_check_fails_when_a_command_words_a_shared_flag_its_own_way(monkeypatch):
    # the broken variant: serve's --dtype with the help of its own it had before
    cmds = commands()
    monkeypatch.setattr(flag(cmds["serve"], "--dtype"), "help", "auto | bfloat16 | float16 | float32.")
    assert disagreements(cmds, "dtype", "--dtype") == ["serve: help 'auto | bfloat16 | float16 | float32.'"]
    monkeypatch.setattr(flag(cmds["run"], "--device"), "default", "cpu")
    assert disagreements(cmds, "device", "--device") == ["defaults ['auto', 'cpu']"]
