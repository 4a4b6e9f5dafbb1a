"""What a measurement reports while it runs, for a view to draw.

`specbench.runner.run_plan` calls these hooks; the command line draws rich progress bars from
them (`specbench.cli.run.ProgressBars`). Every hook does nothing here: a view overrides the ones
it draws. Kept apart from the runner so a command can subclass it without importing the
records machinery at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class PlanProgress:
    def start(self, configs: Sequence[Any], per_config: int) -> None:
        """Measuring begins: `configs` (`runner.Configuration`s), `per_config` samples planned
        for each."""

    def block(self, config: Any, phase: str) -> None:
        """`config` starts its "warm-up" or the next block of its "run"."""

    def result(self, request: Any, result: Any) -> None:
        """A measured request finished (`Request`, `Result`; warm-ups are not reported)."""

    def stop(self) -> None:
        """Measuring ended, done or not."""
