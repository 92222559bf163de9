"""Claims on measurements: two runs on one results file never measure the same setup twice.

A run claims each measurement (its resume key) before its process starts, with a file in
`<results>.claims/` made with O_EXCL; another run that needs the same measurement finds the
claim, says so in one line and waits for the record instead (record.ResultsFile.claims).

A run decides what is done from one read of the file at the start of a plan, and claims each
measurement later, when a slot takes it: another run may append that measurement's record and
release its claim in between. So a run that holds a claim looks at the file once more, for a
record appended since its read (`since`), and takes that record instead of measuring: a record
is appended before its claim is released, so whichever run claims second sees it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

# How often a run waiting for another run's record looks at the results file, seconds.
CLAIM_POLL_S = 0.5
# A claim file that is still empty or unreadable this long after it was made is not being
# written (its run died between making and writing it, or a full disk refused the write): stale.
UNWRITTEN_S = 10.0


class Claims:
    """Which setups (resume keys) a live run is measuring into one results file: a claim file
    per measurement in `<results>.claims/`, made with O_EXCL and holding its run's pid and
    host. A run that finds another live run's claim on a measurement it needs says so in one
    line and waits for that run's record instead of measuring it twice; a claim of a process
    that is gone (killed, crashed), or one never written, is stale and taken over. A claim from
    another host (a results file on a shared disk) cannot be checked for life and is not
    waited for."""

    def __init__(self, results):
        self.results = results
        self.folder = results.path.with_name(results.path.name + ".claims")
        self.mine: set[str] = set()
        self.host = os.uname().nodename

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".claim")

    def claim(self, key: str, say: Callable[[str], None], label: str = "", since: int = 0,
              match: Callable[[list], object] | None = None):
        """Claim the measurement `key` for this process (None: measure it), or return the record
        of it that another run appended after byte `since` of the results file (where this run
        read it, `ResultsFile.end`): one appended before this claim, or the one a live run
        measuring it appends while this waits. Records before `since` do not count: the caller
        read them and measures `key` all the same (--rerun, a stale record). `match` picks the
        measurement's record from records (the executor's `find_done`: a cluster's record names
        the GPU it got, not the type the key asked for); by default, the one whose resume key
        is `key`."""
        said = False
        while True:
            owner = self._take(key)
            if owner is None:
                found = self._record(key, since, match)
                if found is not None:
                    self.release(key)     # measured and released since this run read the file
                return found
            if not said:
                say(f"another stepbench run (pid {owner['pid']}) is measuring {label or key} "
                    f"into {self.results.path}; waiting for its record")
                said = True
            while self._owner(key) == owner and _alive(owner["pid"]):
                found = self._record(key, since, match)
                if found is not None:
                    return found
                time.sleep(CLAIM_POLL_S)

    def release(self, key: str) -> None:
        if key in self.mine:
            self.mine.discard(key)
            try:
                self._path(key).unlink()
                self.folder.rmdir()           # only once it is empty
            except OSError:
                pass

    def _take(self, key: str) -> dict | None:
        """Make the claim (None), or return the live owner's {pid, host} that holds it."""
        path = self._path(key)
        while True:
            try:
                self.folder.mkdir(exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                owner = self._owner(key)
                if owner is None and not _older(path, UNWRITTEN_S):
                    time.sleep(0.05)          # being written this instant: look again
                    continue
                if owner is not None and owner.get("host") != self.host:
                    return None               # another host's: its life cannot be checked
                if owner is None or owner["pid"] == os.getpid() or not _alive(owner["pid"]):
                    try:
                        path.unlink()        # stale: its process is gone, or it was never written
                    except FileNotFoundError:
                        pass
                    continue
                return owner
            except FileNotFoundError:
                continue     # the folder went with another run's last claim, after mkdir: again
            except OSError:
                return None                   # cannot claim here (read-only folder): measure
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps({"pid": os.getpid(), "host": self.host, "key": key}))
            except OSError:
                path.unlink(missing_ok=True)  # a full disk: the record's append will say so
                return None
            self.mine.add(key)
            return None

    def _owner(self, key: str) -> dict | None:
        try:
            owner = json.loads(self._path(key).read_text())
            return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _record(self, key: str, since: int, match: Callable[[list], object] | None):
        records = self.results.read(lambda message: None, since=since)
        if match is not None:
            return match(records)
        found = [r for r in records if r.resume_key() == key]
        return found[-1] if found else None


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
