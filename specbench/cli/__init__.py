"""The `specbench` command: the root Typer app only joins one sub-app per command.

User-facing errors (`SpecbenchError`) become one red line on stderr and a non-zero exit
code here, and only here.
"""

from __future__ import annotations

import sys

import typer

from specbench.errors import SpecbenchError

app = typer.Typer(
    name="specbench",
    help="Benchmark and tune LLM speculative decoding on your own prompts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Sub-apps are imported lazily by module so `specbench --help` stays fast and one broken
    # optional dependency does not take down every command.
    import importlib

    for module, name in (
        ("specbench.cli.run", "run"),
        ("specbench.cli.models", "models"),
        ("specbench.cli.workloads", "workloads"),
        ("specbench.cli.compare", "compare"),
        ("specbench.cli.report", "report"),
        ("specbench.cli.serve", "serve"),
        ("specbench.cli.sweep", "sweep"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # command not built yet
                continue
            raise
        mod.register(app)


_register()


def main() -> None:
    try:
        # Without standalone mode click returns (not raises) a command's typer.Exit code.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecbenchError as exc:
        from rich.console import Console

        from rich.markup import escape

        # Escaped: messages quote TOML sections and JSON ([space], {...}) that rich would eat.
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False,
                                   soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors arrive here with standalone_mode=False
        # Typer may raise its own bundled copy of click's exception classes: match both.
        modules = [m for m in (sys.modules.get("click.exceptions"),
                               sys.modules.get("typer._click.exceptions")) if m is not None]
        if any(isinstance(exc, m.ClickException) for m in modules):
            exc.show()
            sys.exit(exc.exit_code)
        if any(isinstance(exc, getattr(m, "Abort", ())) for m in modules):  # Ctrl-C outside a command's handler
            sys.exit(130)
        raise
