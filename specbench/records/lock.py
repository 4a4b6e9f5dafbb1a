"""One writer per output: an advisory lock on a run directory, a study directory or a report
file, held from before the first write until the writer closes.

`OutLock(directory, owner=...)` takes the lock or raises RecordsError in one line naming the
directory and the pid that holds it. A run takes it alone (`owner=None`); sweep workers of one
study share it (`owner="study <name>"`: many workers of one study write one directory by
design, each trial into its own run directory), and a worker of another study is refused.
`--overwrite` never gets past a live holder: it replaces finished runs only.

How: `flock(2)` on a hidden member file in the directory (`.specbench.lock`, or
`.<name>.lock` for a file output), holding the owner and the pids. The check-and-join is one
critical section under a flock on the directory itself, so two processes never both find the
lock free, and a shared holder never has to convert its lock (Linux's conversion is not
atomic). The kernel drops a flock when its holder dies, so a SIGKILLed writer never leaves
the directory locked; the member file it leaves is empty of meaning and reused. The last
holder to release removes it (and the directory, if its taking created it and nothing else
landed there), under the same critical section.

Boundary: paths and pids; nothing here knows records.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from specbench.errors import RecordsError

LOCK_FILE = ".specbench.lock"


class OutLock:
    """An exclusive (or, for one `owner`, shared) lock on an output directory; `release()`
    (or leaving the `with` block) gives it back."""

    def __init__(self, directory: Path, *, owner: str | None = None, name: str = LOCK_FILE, what: str = "--out",
                 label: Path | None = None):
        self.directory = Path(directory)
        self.label = label or self.directory  # what the messages name: the directory, or the file locked
        self.path = self.directory / name
        self.owner = owner
        self.created = False  # this lock made the directory
        self._fd: int | None = None
        try:
            self._take(what)
        except OSError as exc:
            raise RecordsError(f"{what} {self.label}: cannot write there ({exc.strerror or exc})") from None

    def _take(self, what: str) -> None:
        for _ in range(8):  # the directory may vanish between mkdir and open (a last holder removed it)
            if not self.directory.is_dir():
                try:
                    self.directory.mkdir(parents=True)
                    self.created = True
                except FileExistsError:
                    pass
            try:
                guard = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                _guard(guard)  # the critical section: short, so it blocks
                if os.fstat(guard).st_ino != _inode(self.directory):
                    continue  # removed (and perhaps made again) while we waited: start over
                self._join(what)
                return
            finally:
                os.close(guard)  # closing drops the guard's flock
        raise RecordsError(f"{what} {self.directory}: it keeps being removed and made again; "
                           "is another process cleaning it?")

    def _join(self, what: str) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                holders: list[int] = []  # nobody holds it
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                owner, holders = _read(fd)
                holders = [p for p in holders if _alive(p)]
                if self.owner is None or owner != self.owner:
                    pids = ", ".join(map(str, holders)) or "unknown"
                    by = f", {owner}" if owner else ""
                    raise RecordsError(f"{what} {self.label} is being written by another process (pid {pids}"
                                       f"{by}); wait for it to finish or choose another {what}") from None
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the holders are sharers: this succeeds
            if self.owner is not None and not holders:
                fcntl.flock(fd, fcntl.LOCK_SH)  # EX -> SH inside the critical section: nobody can slip in
            _write(fd, self.owner, holders + [os.getpid()])
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Give the lock back; the last holder removes the member file (and the directory its
        taking created, if it is still empty)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            guard = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            os.close(fd)
            return
        try:
            _guard(guard)
            owner, holders = _read(fd)
            try:  # the last holder: nobody else has it, and nobody can join while we hold the guard
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
            except OSError:
                last = False
                _write(fd, owner, [p for p in holders if p != os.getpid()])
            if last:
                self.path.unlink(missing_ok=True)
                if self.created:
                    try:
                        self.directory.rmdir()  # only if nothing landed there
                    except OSError:
                        pass
        finally:
            os.close(fd)
            os.close(guard)

    def __enter__(self) -> "OutLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _guard(fd: int) -> None:
    """flock the directory `fd`, blocking. A filesystem that cannot lock a directory (NFS
    emulates flock with byte-range locks, which need a file open for writing) goes without
    the guard: the member file's own lock still keeps a second writer out, and only two
    writers starting in the same instant could then both pass the check."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return -1


def _read(fd: int) -> tuple[str | None, list[int]]:
    """(owner, pids) from a member file; a file a killed holder left half-written reads as
    (None, [])."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return data.get("owner"), [int(p) for p in data.get("pids", [])]
    except (ValueError, TypeError, AttributeError, OSError):
        return None, []


def _write(fd: int, owner: str | None, pids: list[int]) -> None:
    data = json.dumps({"owner": owner, "pids": pids}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
