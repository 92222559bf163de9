"""Claims on measurements: runs sharing one results file never measure the same setup twice.

A run claims each measurement (its resume key) before its process starts: it holds an exclusive
flock on a file in `<results>.claims/` for as long as it measures. Another run that needs the
same measurement finds the lock taken, says so in one line and waits for the record instead
(record.ResultsFile.claims), trying the lock again each time it looks. The lock is the claim,
not the pid the file names: the kernel drops it the moment its process ends, however it ends
(SIGKILL, OOM killer), so of any number of waiters exactly one gets it, and a reused pid or a
file left behind by a dead run means nothing. The file's content (pid, host, label) is only
for the waiting line.

A run decides what is done from one read of the file at the start of a plan, and claims each
measurement later, when a slot takes it: another run may append that measurement's record and
release its claim in between. So a run that holds a claim looks at the file once more, for a
record appended since its read (`since`), and takes that record instead of measuring: a record
is appended before its claim is released, so whichever run claims second sees it.

stepbench is Linux-first: fcntl is imported unconditionally (record.py locks its appends the
same way), so there is no Windows path. A filesystem that refuses flock (an NFS mount without a
lock manager answers ENOLCK) gets the older claim by pid: a file made with O_EXCL, stale once
its pid is gone (or it was never written), which two waiters can both take over and which a
reused pid fools. A `nolock` NFS mount grants flock locally only: runs on other hosts then
measure the same setup too, and reading keeps the later record with a warning (record.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

# How often a run waiting for another run's record looks at the results file, seconds.
CLAIM_POLL_S = 0.5
# Without flock: a claim file still empty or unreadable this long after it was made is not
# being written (its run died between making and writing it, or a full disk refused): stale.
UNWRITTEN_S = 10.0

# The claim files this process holds, each with its locked descriptor; one lock over taking and
# releasing them. Two threads of one process never open one claim file twice: where flock is
# emulated with POSIX locks (NFS), the second would get a lock its process already holds, and
# its close would drop the first one's.
_HELD: dict[Path, int] = {}
_HELD_LOCK = threading.Lock()
_STALE = object()      # Claims._by_pid: the stale claim file is removed; make it again


class Claims:
    """Which setups (resume keys) live runs are measuring into one results file: a claim file
    per measurement in `<results>.claims/`, flock'ed by the run measuring it and naming that
    run's pid, host and setup. A run that finds the lock of a measurement it needs held says so
    in one line and waits for that run's record instead of measuring it twice; the lock of a run
    that is gone (killed, crashed) is gone with it, and the next run to try takes the claim."""

    def __init__(self, results):
        self.results = results
        self.folder = results.path.with_name(results.path.name + ".claims")
        self.mine: set[str] = set()
        self.host = os.uname().nodename

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".claim")

    def claim(self, key: str, say: Callable[[str], None], label: str = "", since: int = 0, *,
              match: Callable[[list], object]):
        """Claim the measurement `key` for this process (None: measure it), or return the record
        of it that another run appended after byte `since` of the results file (where this run
        read it, `ResultsFile.end`): one appended before this claim, or the one a live run
        measuring it appends while this waits. Records before `since` do not count: the caller
        read them and measures `key` all the same (--rerun, a stale record). `match` picks the
        measurement's record from records (the executor's `find_done`: a cluster's record names
        the GPU it got, not the type the key asked for)."""
        said = False
        while True:
            owner = self._take(key, label)
            if owner is None:
                found = self._record(since, match)
                if found is not None:
                    self.release(key)     # measured and released since this run read the file
                return found
            if not said and "pid" in owner:   # {}: its owner is writing it this instant
                where = "" if owner.get("host") == self.host else f" on {owner.get('host')}"
                what = label or owner.get("label") or key
                say(f"another stepbench run (pid {owner['pid']}{where}) is measuring {what} "
                    f"into {self.results.path}; waiting for its record")
                said = True
            found = self._record(since, match)
            if found is not None:
                return found
            time.sleep(CLAIM_POLL_S)

    def release(self, key: str) -> None:
        """Give the claim up: the file goes before its lock, so that a run that opened it
        and gets the lock next sees it is no longer the claim (`_take` compares inodes)."""
        path = self._path(key)
        with _HELD_LOCK:
            if key not in self.mine:
                return
            self.mine.discard(key)
            fd = _HELD.pop(path.absolute())
            try:
                path.unlink()
                self.folder.rmdir()           # only once it is empty
            except OSError:
                pass
            os.close(fd)

    def _take(self, key: str, label: str = "") -> dict | None:
        """Make the claim (None), or return its holder's {pid, host, label}; {} while the
        holder has it but has not named itself in the file yet."""
        path = self._path(key)
        with _HELD_LOCK:
            if key in self.mine:
                return None
            if path.absolute() in _HELD:      # another thread of this process measures it
                return self._owner(key) or {"pid": os.getpid(), "host": self.host}
            while True:
                try:
                    self.folder.mkdir(exist_ok=True)
                except OSError:
                    return None               # cannot claim here (read-only folder): measure
                try:
                    fd, made = _open(path)
                except FileNotFoundError:
                    continue   # the folder went with another run's last claim, after mkdir
                except OSError:
                    return None
                locked = _lock(fd)
                if locked is False:
                    os.close(fd)
                    return self._owner(key) or {}
                if locked is None and not made:
                    os.close(fd)
                    owner = self._by_pid(key)
                    if owner is _STALE:
                        continue
                    return owner
                if locked and not _same_file(fd, path):
                    os.close(fd)              # released between our open and our lock: again
                    continue
                _HELD[path.absolute()] = fd
                self.mine.add(key)
                return self._write(key, label, fd)

    def _write(self, key: str, label: str, fd: int) -> None:
        """Name this run in its claim file, for the waiting line of the others."""
        body = json.dumps({"pid": os.getpid(), "host": self.host, "key": key, "label": label})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, body.encode(), 0)
        except OSError:   # a full disk (the record's append will say so), another user's
            path = self._path(key)     # stale file: measure unclaimed
            with contextlib.suppress(OSError):
                path.unlink()
            self.mine.discard(key)
            os.close(_HELD.pop(path.absolute()))
        return None

    def _by_pid(self, key: str):
        """Without flock, the older claim: a file another run made holds while its pid lives
        on this host. Its owner (wait), {} (being written: look again later), None (another
        host's, whose life cannot be checked: measure), or _STALE (removed: make it again)."""
        path = self._path(key)
        owner = self._owner(key)
        if owner is None and not _older(path, UNWRITTEN_S):
            return {}
        if owner is not None and owner.get("host") != self.host:
            return None
        if owner is None or owner["pid"] == os.getpid() or not _alive(owner["pid"]):
            path.unlink(missing_ok=True)      # its process is gone, or it was never written
            return _STALE
        return owner

    def _owner(self, key: str) -> dict | None:
        try:
            owner = json.loads(self._path(key).read_text())
            return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _record(self, since: int, match: Callable[[list], object]):
        """What `match` finds among the records appended since byte `since` (read silently)."""
        return match(self.results.read(lambda message: None, since=since))


def _open(path: Path) -> tuple[int, bool]:
    """The claim file's descriptor (not inherited by child processes, os.open's default: a
    setup's process never keeps its parent's claim), and whether this call made the file."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        pass
    try:
        return os.open(path, os.O_RDWR), False
    except PermissionError:   # another user's: enough to see whether its lock is held
        return os.open(path, os.O_RDONLY), False


def _lock(fd: int) -> bool | None:
    """Take the claim file's lock without waiting: True, False (another holds it), or None
    (this filesystem has no flock: ENOLCK, EOPNOTSUPP)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _same_file(fd: int, path: Path) -> bool:
    """Whether the locked descriptor is still the file at `path` (not one its holder released,
    unlinked, between this run's open and its lock)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _older(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False                          # gone: the next look finds out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                           # another user's live process
    return True
