"""The `specbench` command: the root Typer app only joins one sub-app per command (one
module each in this package; a command parses its flags and calls one library entry point).

User-facing errors (`SpecbenchError`) become one red line on stderr and a non-zero exit
code here, and only here.
"""

from __future__ import annotations

import errno
import sys

import typer

from specbench.errors import SpecbenchError
from specbench import limits

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


def _number_type(param) -> str | None:
    """"int" or "float" for a numeric option (Typer's own parameter class, or click's)."""
    bare = getattr(param, "bare_type", None)
    if bare is not None:
        kind = bare()
        return kind if kind in ("int", "float") else None
    name = getattr(getattr(param, "type", None), "name", None)
    return {"integer": "int", "float": "float"}.get(name)


def _long_flag(param) -> str:
    return max(param.opts, key=len)


# Commands whose numeric options are held to the same `specbench.limits` table where their
# values from a file and from flags meet (sweep: `specbench.sweep.options.section`, whose
# messages name the spec key as well).
UNBOUNDED_HERE = frozenset({"sweep"})


def bound_numbers(command, top: str | None = None) -> None:
    """Hold every integer and float option of `command` (and its subcommands) to its
    `specbench.limits` bound as click parses it: one place for all of them, so a huge, tiny
    or NaN value is a one-line error naming the flag before the command starts."""
    for name, sub in (getattr(command, "commands", None) or {}).items():
        if name not in UNBOUNDED_HERE:
            bound_numbers(sub, top or name)
    for param in getattr(command, "params", ()):
        if _number_type(param) is None or not param.opts:
            continue
        flag = _long_flag(param)

        def checked(ctx, p, value, _flag=flag, _cmd=top, _previous=param.callback):
            if _previous is not None:
                value = _previous(ctx, p, value)
            if isinstance(value, (list, tuple)):
                return type(value)(limits.check(_flag, v, command=_cmd) for v in value)
            return limits.check(_flag, value, command=_cmd)

        param.callback = checked


def command():
    """The click command behind `specbench`, every numeric option bounded."""
    cmd = typer.main.get_command(app)
    bound_numbers(cmd)
    return cmd


def name_too_long(exc: OSError, args: list[str]) -> str:
    """The one-line message for a path longer than the file system allows, naming the flag
    (or argument) it came from."""
    name = str(exc.filename) if exc.filename is not None else ""
    where = "an argument"  # a path derived from one (a run directory inside --out, say)
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg  # --out=PATH
        if len(value) > 255 and name and (value in name or name in value):
            where = _where(args, i)
            break
    shown = name if len(name) <= 60 else f"{name[:40]}...{name[-10:]}"
    return (f"{where}: path {shown!r} ({len(name)} characters) is longer than the file system allows "
            "(255 per name, 4096 in all); give a shorter path")


def _where(args: list[str], i: int) -> str:
    """The flag (or argument) args[i] is the value of."""
    if args[i].startswith("--") and "=" in args[i]:
        return args[i].split("=", 1)[0]
    if i and args[i - 1].startswith("-"):
        return args[i - 1]
    words = args[:2] if args[0] in ("models", "workloads") else args[:1]
    return f"specbench {' '.join(words)}: argument"


def no_home(args: list[str]) -> str:
    """The one-line message for a ~user path whose user has no home directory."""
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.startswith("~"):
            user = value[1:].split("/", 1)[0]
            who = f"no user {user!r} on this machine" if user else "$HOME is not set"
            return (f"{_where(args, i)}: cannot expand {value!r} ({who}); give the path in full "
                    "or relative to the current directory")
    return "a path starting with ~ names a user without a home directory; give the path in full"


def _say(message: str, code: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    # Escaped: messages quote TOML sections and JSON ([space], {...}) that rich would eat.
    # emoji=False: a device such as cuda:abc: must not turn into an emoji
    Console(stderr=True, emoji=False).print(f"[bold red]error:[/] {escape(message)}", highlight=False,
                                            soft_wrap=True)
    sys.exit(code)


def main() -> None:
    try:
        # Without standalone mode click returns (not raises) a command's typer.Exit code.
        code = command()(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecbenchError as exc:
        _say(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # A 5000-character path argument: Path.exists() and is_dir() raise instead of saying
        # False, anywhere a file, model, workload or spec is looked up. One line, naming the flag.
        _say(name_too_long(exc, sys.argv[1:]), 2)
    except RuntimeError as exc:
        if "home directory" not in str(exc):
            raise
        # Path('~nosuchuser/x').expanduser(): a model, workload or file under an unknown user's
        # home raises RuntimeError wherever a path is looked up.
        _say(no_home(sys.argv[1:]), 2)
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
