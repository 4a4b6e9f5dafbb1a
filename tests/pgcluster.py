"""A throwaway PostgreSQL cluster for tests: initdb into a temporary directory, a server on
127.0.0.1 (a free port, Unix socket in that directory, trust auth for loopback only), stopped
and removed afterwards. PostgreSQL refuses to run as root, so under root the server runs as
the unprivileged `postgres` user (created by Debian's postgresql package) or `nobody`.

`Cluster.start()` raises `Unavailable` with a one-line reason when no server can be had (no
binaries, no driver, no unprivileged user, initdb or start failing); tests skip with it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path


class Unavailable(Exception):
    """No PostgreSQL server can be started here (the message says why)."""


def find_bindir() -> Path | None:
    """Directory holding initdb/pg_ctl: on PATH, else Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2])
                    if p.split("/")[-2].isdigit() else 0, reverse=True):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self) -> None:
        self.root: Path | None = None
        self.port = 0
        self.user: str | None = None  # the OS user the server runs as (None: this one)
        self.bindir: Path | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> "Cluster":
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is None:
            raise Unavailable("no PostgreSQL driver installed (pip install 'specbench[postgres]')")
        self.bindir = find_bindir()
        if self.bindir is None:
            raise Unavailable("no PostgreSQL server binaries (initdb, pg_ctl); on Debian: "
                              "apt-get install postgresql")
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user = name
                break
            else:
                raise Unavailable("running as root and no unprivileged user (postgres, nobody) "
                                  "to run the server as")
        self.root = Path(tempfile.mkdtemp(prefix="specbench-pg-"))
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.port = _free_port()
        init = self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "specbench",
                          "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"])
        if init.returncode != 0:
            self.remove()
            raise Unavailable(f"initdb failed: {_last_line(init.stderr or init.stdout)}")
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server (again, after `pause`)."""
        assert self.root is not None and self.bindir is not None
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c max_connections=100")
        started = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                             str(self.root / "server.log"), "-w", "-t", "30", "-o", opts, "start"])
        if started.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace") if (self.root / "server.log").exists() else ""
            self.remove()
            raise Unavailable(f"the PostgreSQL server did not start: {_last_line(log or started.stderr)}")

    def pause(self) -> None:
        """Stop the server (fast shutdown: open connections are cut), keeping the data."""
        assert self.root is not None and self.bindir is not None
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def stop(self) -> None:
        """Stop the server at once (the data is thrown away) and remove everything."""
        if self.root is None:
            return
        if (self.data / "postmaster.pid").exists():
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        self.remove()

    def remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    # ---- use -------------------------------------------------------------------------

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://specbench@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL (plain postgresql://, as a user writes it)."""
        import sqlalchemy as sa

        from specbench.sweep.storage import normalize_storage_url

        name = "t_" + uuid.uuid4().hex[:10]
        engine = sa.create_engine(normalize_storage_url(self.url()), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, user=self.user,
                              group=pwd.getpwnam(self.user).pw_gid if self.user else None,
                              cwd=self.root, env={**os.environ, "LC_ALL": "C"})


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
