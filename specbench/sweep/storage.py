"""Where a study lives: an Optuna RDB (SQLite file, PostgreSQL, MySQL) or a journal file, shared
by every worker of a sweep.

`open_storage()` returns a `SweepStorage`: Optuna's own storage (RDB behind Optuna's trial cache,
or `JournalStorage` over a `JournalFileBackend`) with two things added for sweeps spread over
hosts:

- heartbeats for every kind: RDB storages use Optuna's (`heartbeat_interval`, `grace_period`,
  timestamps from the database server); the journal file, which has none in Optuna, gets the
  same contract here, with the heartbeat kept in a trial system attr (host clocks, so hosts
  must agree on the time to within the grace period). A trial whose worker stopped beating
  for `grace_period` seconds is failed as stale by the next worker that looks and queued
  again by Optuna's `RetryHeartbeatStaleTrialCallback`, with the same parameters.
- retried calls: a call that fails because the database cannot be reached (a restarted
  server, a dropped connection, a SQLite file locked for long) is retried until `retry_s`
  seconds have passed without an answer; then `StorageError` says so in one line. Pooled
  connections are checked before use (`pool_pre_ping`), so a restarted server is reconnected
  to rather than failed on. A heartbeat that cannot be written is skipped (the next one tries
  again) instead of killing the heartbeat thread.

Storage URLs: an RDB URL (`sqlite:///PATH.db`, `postgresql://user@host/db`), a bare path (a
SQLite file), or `journal:PATH` (Optuna's journal file; a shared filesystem is enough); how
they are spelled is `specbench.sweep.urls`.

Boundary: storage only; what a study and its trials mean is `specbench.sweep.study` and
`specbench.sweep.trials`.
"""

from __future__ import annotations

import abc
import copy
import errno
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from specbench.errors import ConfigError, StorageError
from specbench.sweep.options import DEFAULT_GRACE_S as GRACE_S
from specbench.sweep.options import DEFAULT_HEARTBEAT_S as HEARTBEAT_S
from specbench.sweep.options import DEFAULT_STORAGE_RETRY_S as RETRY_S
from specbench.sweep.urls import JOURNAL_PREFIX, display_url, sqlite_path, storage_url

HEARTBEAT_ATTR = "specbench_heartbeat"  # journal storage: time.time() of the last heartbeat


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def normalize_storage_url(url: str) -> str:
    """`urls.storage_url(url)`, and a `postgresql://` URL gets the PostgreSQL driver that is
    installed (psycopg 3, else psycopg2), so the URL works whichever one SQLAlchemy would pick
    by default."""
    url = storage_url(url)
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        return f"postgresql+{_postgres_driver(url)}://{rest}"
    return url


def _postgres_driver(url: str) -> str:
    import importlib.util

    for module, dialect in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return dialect
    raise ConfigError(f"--storage {display_url(url)}: no PostgreSQL driver is installed; "
                      "install one with: pip install 'specbench[postgres]' (psycopg)")


def _transient(exc: BaseException | None) -> BaseException | None:
    """The error in `exc`'s chain saying the storage is unreachable right now (not that the
    call is wrong): a dropped or refused connection, a database shutting down, a locked SQLite
    file, an I/O error of a shared filesystem. None when there is none."""
    import sqlalchemy.exc as sa_exc

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError,
                            sa_exc.DisconnectionError, sa_exc.TimeoutError)):
            return exc
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return exc
        if isinstance(exc, OSError) and exc.errno in (errno.EIO, errno.ESTALE, errno.ETIMEDOUT,
                                                      errno.EAGAIN, errno.ENOLCK):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class SweepStorage(BaseStorage, BaseHeartbeat):
    """An Optuna storage with retried calls and heartbeats (see the module docstring). Every
    `BaseStorage` method is forwarded to `inner`; the forwarding methods are made below."""

    def __init__(self, inner: BaseStorage, url: str, *, heartbeat_interval: int, grace_period: int,
                 retry_s: float, on_event: Callable[[str], None] | None = None) -> None:
        self.inner = inner
        self.url = url
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.retry_s = retry_s
        self.on_event = on_event or (lambda message: None)
        self._own_heartbeat = not isinstance(inner, BaseHeartbeat)
        self._beating: set[int] = set()  # trials this process runs (it beats for them)
        self._down = False  # the storage stopped answering (a call or a heartbeat saw it)
        self._back_at: float | None = None  # monotonic time it answered again
        self._beat_down_since: float | None = None  # a heartbeat found it unreachable then
        self._gave_up = False  # a call already waited retry_s in vain: the next ones try once
        with warnings.catch_warnings():  # experimental since Optuna 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._stale_callback = _RetryStale()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.inner, name)
        down_since: float | None = None
        while True:
            try:
                result = method(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - sorted by _transient
                cause = _transient(exc)
                if cause is None:
                    raise
                why = f"{type(cause).__name__}: {first_line(cause)}"
                now = time.monotonic()
                self._down = True
                if down_since is None:
                    down_since = now
                    self.on_event(f"study storage {display_url(self.url)} unreachable ({why}); "
                                  f"retrying for up to {self.retry_s:g} s")
                if self._gave_up or now - down_since >= self.retry_s:
                    # the worker is stopping: its last writes (the trial's state) try once
                    self._gave_up = True
                    raise StorageError(
                        f"study storage {display_url(self.url)} gave no answer for "
                        f"{self.retry_s:g} s ({why}); the trial "
                        "in flight is measured again when a worker next runs (raise "
                        "--storage-retry to wait longer)") from None
                time.sleep(min(1.0, max(0.05, self.retry_s / 20)))
                continue
            if down_since is not None:
                self.on_event(f"study storage {display_url(self.url)} answers again after "
                              f"{time.monotonic() - down_since:.1f} s")
            self._up()
            self._gave_up = False
            return result

    def _up(self) -> None:
        if self._down:
            self._down, self._back_at = False, time.monotonic()

    # ---- heartbeats ---------------------------------------------------------------------

    def record_heartbeat(self, trial_id: int) -> None:
        self._beating.add(trial_id)
        try:  # one try per beat: the next beat comes heartbeat_interval later
            if self._own_heartbeat:
                self.inner.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
            else:
                self.inner.record_heartbeat(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # failed as stale elsewhere meanwhile; the trial's own writes will say so
        except Exception as exc:  # noqa: BLE001
            cause = _transient(exc)
            if cause is None:
                raise
            if self._beat_down_since is None:  # said once per outage, from the heartbeat thread
                self._beat_down_since = time.monotonic()
                self.on_event(f"study storage {display_url(self.url)} unreachable (heartbeat: "
                              f"{type(cause).__name__}: {first_line(cause)}); the trial goes on")
            self._down = True
            return
        if self._beat_down_since is not None:
            self.on_event(f"study storage {display_url(self.url)} answers again after "
                          f"{time.monotonic() - self._beat_down_since:.1f} s (heartbeat)")
            self._beat_down_since = None
        self._up()

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Running trials silent for the grace period, never this process's own (they are
        alive), and none within the grace period after the storage was unreachable from here:
        nobody's heartbeat got through then, and live workers' next ones are a moment away.
        Each is given its reason (`fail_reason`, `stale`) before Optuna fails it."""
        stale = self._stale_ids(study_id)
        for trial_id in stale:
            try:
                self._call("set_trial_user_attr", trial_id, "fail_reason", STALE_REASON.format(s=self.grace_period))
                self._call("set_trial_user_attr", trial_id, "stale", True)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # failed by another worker meanwhile: it gave the reason
        return stale

    def _stale_ids(self, study_id: int) -> list[int]:
        if self._down or (self._back_at is not None
                          and time.monotonic() - self._back_at < self.grace_period):
            return []
        if not self._own_heartbeat:
            return [i for i in self._call("_get_stale_trial_ids", study_id) if i not in self._beating]
        now = time.time()
        stale = []
        for t in self._call("get_all_trials", study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get(HEARTBEAT_ATTR)
            if beat is None and t.datetime_start is not None:
                beat = t.datetime_start.timestamp()
            if t._trial_id not in self._beating and beat is not None and now - float(beat) > self.grace_period:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self._stale_callback


STALE_REASON = ("worker lost: no heartbeat for {s} s (its process was killed or its host went away); "
                "the configuration is measured again")
_STALE_ATTRS = ("fail_reason", "stale")


class _RetryStale(optuna.storages.RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a stale trial (called once, by the worker whose storage write failed
    it), without the stale trial's failure attrs: the retry starts clean."""

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in _STALE_ATTRS}
        super().__call__(study, trial)


def _forward(name: str) -> Callable[..., Any]:
    def method(self: SweepStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(BaseStorage, name).__doc__
    return method


for _name, _member in vars(BaseStorage).items():
    if callable(_member) and not _name.startswith("_") and _name not in vars(SweepStorage):
        setattr(SweepStorage, _name, _forward(_name))
abc.update_abstractmethods(SweepStorage)
assert not SweepStorage.__abstractmethods__, SweepStorage.__abstractmethods__


def fail_stale(study: optuna.Study) -> None:
    """Fail the study's running trials whose heartbeat stopped (Optuna queues each again)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def open_storage(url: str, *, heartbeat_interval: int = HEARTBEAT_S, grace_period: int = GRACE_S,
                 retry_s: float = RETRY_S, on_event: Callable[[str], None] | None = None) -> SweepStorage:
    """Open (creating tables or the journal file on first use) a study storage shared by
    workers; see the module docstring."""
    url = normalize_storage_url(url)
    shown = display_url(url)
    if url.startswith(JOURNAL_PREFIX):
        inner: BaseStorage = _open_journal(url[len(JOURNAL_PREFIX):], shown)
    else:
        inner = optuna.storages._CachedStorage(_open_rdb(url, shown, heartbeat_interval, grace_period))
    return SweepStorage(inner, url, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                        retry_s=retry_s, on_event=on_event)


def _mkdir_for(path: str, shown: str) -> None:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--storage {shown}: cannot create its directory ({first_line(exc)})") from None


def _open_journal(path: str, shown: str) -> BaseStorage:
    from optuna.storages.journal import JournalFileBackend

    if not path:
        raise ConfigError("--storage journal:PATH needs a file path, e.g. journal:/shared/sweeps/STUDY.log")
    _mkdir_for(path, shown)
    try:
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    except OSError as exc:
        raise ConfigError(f"--storage {shown} cannot be opened: {first_line(exc)}") from None


def _open_rdb(url: str, shown: str, heartbeat_interval: int, grace_period: int) -> optuna.storages.RDBStorage:
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}  # reconnect after a server restart
    path = sqlite_path(url)
    if path is not None:
        if path and path != ":memory:":
            _mkdir_for(path, shown)
        # Several workers on one SQLite file wait for the write lock instead of failing.
        engine_kwargs["connect_args"] = {"timeout": 60}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                                  heartbeat_interval=heartbeat_interval,
                                                  grace_period=grace_period)
        except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors of every kind
            # Workers starting together race to create the schema of a new storage; the loser
            # fails on a unique constraint and finds the tables there a moment later.
            text = f"{type(exc).__name__} {exc}"
            if attempt < 2 and any(m in text for m in ("IntegrityError", "already exists", "locked")):
                time.sleep(0.5 * (attempt + 1))
                continue
            raise ConfigError(f"--storage {shown} cannot be opened: {first_line(exc)} "
                              "(use sqlite:///PATH.db, journal:PATH or an RDB URL such as "
                              "postgresql://user@host/db with its driver installed)") from None
    raise AssertionError("unreachable")
