"""The workers of one study: who is measuring, and which of them writes the serving profile.

Every `specbench sweep` process that measures registers itself in the study (a study user
attr `specbench_worker:<id>` holding host, pid, state and when it was last seen) and tags
each trial it runs with its id (`worker` user attr). A worker is alive while its state is
`running` and it either holds a running trial (Optuna's heartbeat vouches for it; a stale
one is failed first) or was seen within the grace period (the moments between two trials).
A worker killed outright therefore counts as gone once its trial goes stale.

The profile is written once per study, by the last worker to finish: a finishing worker
first marks itself done, then looks for other live workers, so at least one of the workers
finishing together sees none. When another worker finished within the last few seconds,
both may see none: they then claim the write (each sets `specbench_profile_claim`, waits
`SETTLE_S`, and only the one whose claim stands writes: the storage orders the claims, so the
writer is the last to claim, not always the last to finish by a host's clock, which hosts
need not agree on). Claims made within SETTLE_S of each
other resolve to one writer; two workers whose claims are further apart than that would both
write the same, complete profile (each write is atomic).

Nothing here prints; the caller gets the facts back.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from specbench.sweep.storage import fail_stale

WORKER_ATTR = "specbench_worker:"
CLAIM_ATTR = "specbench_profile_claim"
PROFILE_ATTR = "specbench_profile"
SETTLE_S = 2.0  # how long a profile claim must stand before the claimant writes
RECENT_S = 10.0  # another worker that finished this recently may be claiming too


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Worker:
    study: optuna.Study
    grace_s: float
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.host}:{self.pid}:{uuid.uuid4().hex[:6]}"
        self.started = _now_iso()

    @property
    def key(self) -> str:
        return WORKER_ATTR + self.id

    def _set(self, state: str) -> None:
        self.study.set_user_attr(self.key, {"host": self.host, "pid": self.pid, "state": state,
                                            "started": self.started, "seen": time.time()})

    def register(self) -> None:
        self._set("running")

    def touch(self) -> None:
        """Seen now (called between trials, so a worker without a running trial still counts)."""
        self._set("running")

    def finish(self) -> None:
        self._set("done")

    def others(self) -> dict[str, dict[str, Any]]:
        attrs = self.study.user_attrs
        return {k[len(WORKER_ATTR):]: v for k, v in attrs.items()
                if k.startswith(WORKER_ATTR) and k != self.key and isinstance(v, dict)}

    def others_alive(self) -> list[dict[str, Any]]:
        """Other workers still measuring (see the module docstring)."""
        others = self.others()
        if not any(v.get("state") == "running" for v in others.values()):
            return []
        fail_stale(self.study)
        holding = {t.user_attrs.get("worker") for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,))}
        now = time.time()
        return [{"id": wid, **v} for wid, v in sorted(others.items())
                if v.get("state") == "running"
                and (wid in holding or now - float(v.get("seen", 0)) < self.grace_s)]

    def should_write_profile(self) -> tuple[bool, str]:
        """Whether this (finished) worker writes the profile, and a one-line reason."""
        alive = self.others_alive()
        if alive:
            where = ", ".join(f"{w['host']} pid {w['pid']}" for w in alive)
            return False, (f"{len(alive)} other worker(s) still measuring this study ({where}): "
                           "the last one to finish writes the profile")
        now = time.time()
        recent = [v for v in self.others().values()
                  if v.get("state") == "done" and now - float(v.get("seen", 0)) < RECENT_S]
        if recent:
            self.study.set_user_attr(CLAIM_ATTR, self.id)
            time.sleep(SETTLE_S)
            holder = self.study.user_attrs.get(CLAIM_ATTR)
            if holder != self.id:
                return False, f"the profile is written by worker {holder}, which finished at the same time"
        return True, ""

    def profile_written(self, path: str, n_trials: int) -> None:
        self.study.set_user_attr(PROFILE_ATTR, {"worker": self.id, "host": self.host, "path": path,
                                                "trials": n_trials, "written_at": _now_iso()})
