"""Claims on measurements: two runs on one results file never measure the same setup twice.

A run claims each measurement (its resume key) before its process starts, with a file in
`<results>.claims/` made with O_EXCL; another run that needs the same measurement finds the
claim, says so in one line and waits for the record instead (record.ResultsFile.claims).
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


class Claims:
    """Which setups (resume keys) a live run is measuring into one results file: a claim file
    per measurement in `<results>.claims/`, made with O_EXCL and holding its run's pid and
    host. A run that finds another live run's claim on a measurement it needs says so in one
    line and waits for that run's record instead of measuring it twice; a claim of a process
    that is gone (killed, crashed) is stale and taken over. A claim from another host (a
    results file on a shared disk) cannot be checked for life and is not waited for."""

    def __init__(self, results):
        self.results = results
        self.folder = results.path.with_name(results.path.name + ".claims")
        self.mine: set[str] = set()
        self.host = os.uname().nodename

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".claim")

    def claim(self, key: str, say: Callable[[str], None], label: str = "") :
        """Claim the measurement `key` for this process (None: measure it), or wait for the
        record that another live run measuring it appends, and return that record."""
        said = False
        while True:
            owner = self._take(key)
            if owner is None:
                return None
            if not said:
                say(f"another stepbench run (pid {owner['pid']}) is measuring {label or key} "
                    f"into {self.results.path}; waiting for its record")
                said = True
            while self._owner(key) == owner and _alive(owner["pid"]):
                found = self._record(key)
                if found is not None:
                    return found
                time.sleep(CLAIM_POLL_S)
            found = self._record(key)
            if found is not None:
                return found

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
                if owner is None or owner.get("host") != self.host:
                    # Being written this instant, or another host's: look again, or go ahead.
                    if owner is None:
                        time.sleep(0.05)
                        continue
                    return None
                if owner["pid"] == os.getpid() or not _alive(owner["pid"]):
                    try:
                        path.unlink()        # stale: its process is gone
                    except FileNotFoundError:
                        pass
                    continue
                return owner
            except OSError:
                return None                   # cannot claim here (read-only folder): measure
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"pid": os.getpid(), "host": self.host, "key": key}))
            self.mine.add(key)
            return None

    def _owner(self, key: str) -> dict | None:
        try:
            owner = json.loads(self._path(key).read_text())
            return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _record(self, key: str) :
        found = [r for r in self.results.read(lambda message: None) if r.resume_key() == key]
        return found[-1] if found else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                           # another user's live process
    return True
