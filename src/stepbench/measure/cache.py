"""Small JSON caches on the machine that runs the setups, so that a run does not pay twice for
what does not change between setups: the GPU's measured matmul rate (peaks.cached_matmul_tflops)
and the FLOPs torch counts for one sequence of a model shape (step.flop_fields).

Each cache is one JSON file in the cache folder: `$STEPBENCH_CACHE_DIR`, else
`$XDG_CACHE_HOME/stepbench`, else `~/.cache/stepbench`. An entry holds the exact key it was
measured under (GPU, driver, torch and CUDA versions, ...), the value and when it was measured.
An entry is used only when its key matches exactly and it is younger than the cache's maximum
age: a stale or foreign entry is ignored and measured again, never trusted. A file that cannot be
read (damaged, another program's) is ignored the same way and rewritten on the next store.
Writers take a lock and replace the file atomically, so concurrent setups (one per GPU) neither
lose each other's entries nor leave half a file.

Deleting the folder is always safe: everything in it is measured again when needed.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

CACHE_ENV = "STEPBENCH_CACHE_DIR"
VERSION = 1           # of the file layout; a file of another version is ignored


def positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def cache_dir() -> Path:
    folder = os.environ.get(CACHE_ENV)
    if folder:
        return Path(folder)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepbench"


class JsonCache:
    """One cache file: entries of {key, value, measured_at}, looked up by exact key."""

    def __init__(self, name: str, max_age: timedelta | None = None):
        self.name = name
        self.max_age = max_age

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.name}.json"

    def get(self, key: dict, now: datetime | None = None) -> tuple[object, str] | None:
        """(value, measured_at) of the entry with exactly this key and within the maximum age,
        else None."""
        now = now or datetime.now(timezone.utc)
        for entry in self._entries():
            if entry.get("key") != key:
                continue
            try:
                measured_at = datetime.fromisoformat(entry["measured_at"])
            except (KeyError, TypeError, ValueError):
                continue
            if measured_at.tzinfo is None or measured_at > now + timedelta(minutes=5):
                continue            # no zone, or from the future: a clock we cannot trust
            if self.max_age is not None and now - measured_at > self.max_age:
                continue            # stale
            return entry.get("value"), entry["measured_at"]
        return None

    def fetch(self, key: dict | None, measure, valid=lambda value: True,
              cached_only: bool = False) -> tuple[object, str] | None:
        """(value, measured_at): the cached value for `key` when `valid(value)`, else
        `measure()`'s, stored under `key`. A key of None means "cannot tell what must match":
        measured, never stored. `cached_only` (a search's probe reads the caches, measures
        nothing): the cached value, else None."""
        hit = self.get(key) if key is not None else None
        if hit is not None and valid(hit[0]):
            return hit
        if cached_only:
            return None
        value = measure()
        if key is None:
            return value, datetime.now(timezone.utc).isoformat(timespec="seconds")
        return value, self.put(key, value)

    def put(self, key: dict, value: object, measured_at: datetime | None = None) -> str:
        """Store `value` under `key` (replacing an entry with the same key); returns the
        measured_at it was stored with. A cache that cannot be written is skipped with a note on
        stderr: caching must never fail a measurement."""
        stamp = (measured_at or datetime.now(timezone.utc)).isoformat(timespec="seconds")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                entries = [e for e in self._entries() if e.get("key") != key]
                entries.append({"key": key, "value": value, "measured_at": stamp})
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.name}-")
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": VERSION, "entries": entries}, f, indent=1)
                os.replace(tmp, self.path)
        except OSError as exc:
            print(f"stepbench: could not write the {self.name} cache {self.path}: {exc}",
                  file=sys.stderr)
        return stamp

    def _entries(self) -> list[dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(f"stepbench: ignoring the unreadable {self.name} cache {self.path} ({exc}); "
                  "it is measured again", file=sys.stderr)
            return []
        if not isinstance(data, dict) or data.get("version") != VERSION \
                or not isinstance(data.get("entries"), list):
            return []
        return [e for e in data["entries"] if isinstance(e, dict)]
