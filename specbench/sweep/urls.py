"""How a study's storage is spelled: an RDB URL (`sqlite:///PATH.db`, `postgresql://user@host/db`),
a bare path (a SQLite file there) or `journal:PATH` (Optuna's journal file).

The one place that turns what a user wrote into a storage URL, finds a SQLite URL's file and
hides passwords for messages. Boundary: strings only; opening a storage (and choosing the
PostgreSQL driver) is `specbench.sweep.storage`'s job, so nothing here imports Optuna.
"""

from __future__ import annotations

import re

from specbench.errors import ConfigError

JOURNAL_PREFIX = "journal:"
SQLITE_PREFIX = "sqlite:///"


def storage_url(url: str) -> str:
    """An RDB URL or `journal:PATH` as given; a bare path means a SQLite file there. A
    scheme without its `//` is refused rather than taken for a file name."""
    if url.startswith(JOURNAL_PREFIX) or "://" in url:
        return url
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", url)
    if scheme and len(scheme.group(1)) > 1:  # sqlite:x.db, postgresql:host (C:\x.db is a path)
        raise ConfigError(f"--storage {url!r} looks like a URL without '//': use sqlite:///PATH.db, "
                          "postgresql://user@host/db, journal:PATH or a plain file path")
    return f"{SQLITE_PREFIX}{url}"


def sqlite_path(url: str) -> str | None:
    """The file of a `sqlite:///PATH` URL (may be empty or `:memory:`); None for other URLs."""
    return url[len(SQLITE_PREFIX):] if url.startswith(SQLITE_PREFIX) else None


def display_url(url: str) -> str:
    """The storage URL for messages: passwords hidden."""
    if url.startswith(JOURNAL_PREFIX) or "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for messages
        return url
