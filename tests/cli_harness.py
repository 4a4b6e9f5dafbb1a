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

    def refusal(self, *needles: str, alone: bool = True) -> str:
        """Check that the command refused its input as specbench must: exit code 2, no
        traceback, exactly one `error: ` line (with `alone`, nothing else on stderr), and every
        needle in the message. Returns stderr with its whitespace collapsed."""
        assert self.code == 2, self.output
        assert "Traceback" not in self.output, self.output
        assert len(self.error_lines) == 1 and self.error_lines[0].startswith("error: "), self.err
        if alone:
            assert self.err.strip().splitlines() == self.error_lines, self.err
        msg = " ".join(self.err.split())
        for n in needles:
            assert n in msg, (n, msg)
        return msg


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
