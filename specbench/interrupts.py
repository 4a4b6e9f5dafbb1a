"""SIGTERM handled like Ctrl-C, so CI cancellation, `timeout` and Kubernetes stop a run the
way a user does: every finished sample written, the status recorded, a conventional exit code.

    with TerminateAsInterrupt() as stop:
        ...                     # SIGTERM raises KeyboardInterrupt here, in the main thread
    stop.signal_name            # "SIGTERM" or "SIGINT" once one arrived
    stop.exit_code              # 143 after SIGTERM, 130 after Ctrl-C
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class TerminateAsInterrupt:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: Any = None

    @property
    def exit_code(self) -> int:
        return 143 if self.signal_name == "SIGTERM" else 130

    def _handler(self, signum: int, frame: Any) -> None:
        self.signal_name = "SIGTERM"
        raise KeyboardInterrupt

    def __enter__(self) -> "TerminateAsInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is KeyboardInterrupt and self.signal_name is None:
            self.signal_name = "SIGINT"
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
