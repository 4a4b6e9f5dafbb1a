"""Start an inference server from a command template, wait until it serves, stop it: one
server per configuration when a sweep spans server settings (vLLM, SGLang, `specbench serve`).

A template is one command line with `{name}` placeholders, e.g.

    vllm serve {target} --port {port} --speculative-config '{"method": "ngram", "num_speculative_tokens": {k}}'

It is split with `shlex` (POSIX quoting) first and each placeholder is then filled inside its
own argument, so a value never becomes a second argument or shell syntax: no shell runs.
Only `{identifier}` is a placeholder (JSON braces stay as they are); `{port}` without a
value gets a free loopback port. Readiness = GET /health and GET /v1/models both answer 200.

Boundary: processes and readiness only; what runs against the server is the openai backend's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from specbench.errors import BackendError, ConfigError

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`: read from /proc on Linux, else
    whether the group still exists at all (signal 0)."""
    proc = Path("/proc")
    if proc.is_dir():
        pids = []
        for stat in proc.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
                pids.append(int(stat.parent.name))
        return pids
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pgid]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(template: str, params: dict[str, Any]) -> list[str]:
    """argv of `template` with placeholders filled; ConfigError names unknown placeholders."""
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"server command template: {exc}") from None
    if not parts:
        raise ConfigError("server command template is empty")
    unknown = sorted({name for p in parts for name in _PLACEHOLDER.findall(p)} - set(params))
    if unknown:
        raise ConfigError(f"server command template: no value for {', '.join('{' + u + '}' for u in unknown)}; "
                          f"known: {', '.join(sorted(params)) or 'none'}")
    return [_PLACEHOLDER.sub(lambda m: _text(params[m.group(1)]), p) for p in parts]


class ServerLauncher:
    def __init__(self, template: str, params: dict[str, Any] | None = None, *, host: str = "127.0.0.1",
                 ready_timeout_s: float = 600.0, log_path: Path | None = None,
                 env: dict[str, str] | None = None):
        self.params = dict(params or {})
        self.host = host
        if "{port}" in template and "port" not in self.params:
            self.params["port"] = free_port(host)
        self.argv = render(template, self.params)
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._exit_code: int | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.params.get('port', 8000)}"

    def exit_code(self) -> int | None:
        """The server's exit code once it exited (or was stopped); None while it runs."""
        if self.proc is not None:
            return self.proc.poll()
        return self._exit_code

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> str:
        """Start the server and return its base URL once it answers /health and /v1/models."""
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="specbench-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)  # its own group: stop() ends its children too
        except OSError as exc:
            self._log.close()
            raise ConfigError(f"server command {self.argv[0]!r}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.ready_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.stop()
                    raise BackendError(f"server exited with code {code} before it was ready "
                                       f"({shlex.join(self.argv)}); log {self.log_path}: {self.log_tail(5)!r}")
                if self._ready(client):
                    return self.base_url
                if time.monotonic() > deadline:
                    self.stop()
                    raise BackendError(f"server not ready after {self.ready_timeout_s:g} s "
                                       f"({shlex.join(self.argv)}); log {self.log_path}")
                time.sleep(0.25)

    def _ready(self, client: httpx.Client) -> bool:
        try:
            return all(client.get(self.base_url + p).status_code == 200 for p in ("/health", "/v1/models"))
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after `timeout_s`; its exit code.
        Returns once every process of the group is gone, not only the one it started: a
        server's workers (vLLM's engine core) may outlive their parent by seconds, holding
        memory and cores the next trial needs."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.poll() is not None and group_members(proc.pid):
                # The leader exited on its own (during start-up, or a crash) and left workers
                # behind holding the port and the memory: they get the SIGTERM it never sent.
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)  # the group we created in start()
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    continue
            code = proc.wait()
            deadline, killed = time.monotonic() + timeout_s, False
            while group_members(proc.pid):  # the rest of the group got the SIGTERM too
                if time.monotonic() > deadline:
                    if killed:
                        break  # unkillable (uninterruptible sleep): nothing more to do
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        break
                    deadline, killed = time.monotonic() + 5.0, True
                time.sleep(0.1)
            self._exit_code = code
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> "ServerLauncher":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
