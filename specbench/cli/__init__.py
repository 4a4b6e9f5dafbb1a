"""The `specbench` command: the root Typer app only joins one sub-app per command (one
module each in this package; a command parses its flags and calls one library entry point).

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


COMMANDS = ("run", "models", "workloads", "compare", "report", "serve", "sweep")  # specbench.cli.<name>


def _register() -> None:
    # Each command module imports only typer, rich and specbench's plain-data modules at the
    # top (its work imports stay inside the command), so joining them all keeps
    # `specbench --help` fast. A module that fails to
    # import is a broken installation: the error surfaces here rather than hiding a command.
    import importlib

    for name in COMMANDS:
        importlib.import_module(f"specbench.cli.{name}").register(app)


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
        # emoji=False: a device such as cuda:abc: must not turn into an emoji
        Console(stderr=True, emoji=False).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False,
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
