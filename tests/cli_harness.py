"""Run `specbench ARGS` in-process through the real entry point, `specbench.cli.main()`
(which turns SpecbenchError into one `error:` line and an exit code), capturing both streams."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass

import pytest

from specbench.cli import main


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def output(self) -> str:
        return self.out + self.err

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]

    def __iter__(self):  # `code, out, err = specbench(...)`
        return iter((self.code, self.out, self.err))


def specbench(*args, columns: int = 200) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", str(columns))  # wide tables; one error line stays one line
        mp.setattr(sys, "argv", ["specbench", *map(str, args)])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Outcome(code, out.getvalue(), err.getvalue())
