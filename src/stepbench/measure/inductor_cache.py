"""Damaged files in inductor's cache, removed before a compiled setup compiles.

A compile killed mid-way (a timeout, tune's shortened limit, Ctrl-C, the OOM killer) can leave a
half-written shared object or object file in the inductor cache: g++ and the linker write the
target in place, and inductor builds one only where none exists (codecache._worker_compile_cpp),
so every later compile of that graph loads the stub and fails ("file too short"), in every later
run that shares the cache (tune's ~/.cache/stepbench/inductor, a --compile-cache folder). Before
a compiled setup compiles, its process removes the cache's ELF files that cannot be whole: too
short for an ELF header, no ELF magic (the linker writes the header last), or ending before
their section headers (which g++ and ld write at the end). A file is removed only under
inductor's own lock for its key (`locks/<key>.lock`, the name codecache gives it: so never one
that another process is building right now); a file without a lock of that name (one some other
builder writes) only when it has not changed for a few seconds.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

# A damaged file this recently modified may still be being written by a builder that does not
# take inductor's lock of its name: left alone.
QUIET_S = 5.0
SUFFIXES = (".so", ".o")


def damaged(path: Path) -> bool:
    """Whether an ELF file cannot be whole: shorter than its header, without the ELF magic, or
    shorter than where its header says the section headers end."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return True
    order = "<" if head[5] == 1 else ">"
    if head[4] == 2:                      # ELF64
        if len(head) < 64:
            return True
        (shoff,) = struct.unpack_from(order + "Q", head, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", head, 0x3A)
    else:                                 # ELF32
        (shoff,) = struct.unpack_from(order + "I", head, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", head, 0x2E)
    return shoff > 0 and size < shoff + shentsize * shnum


def folder() -> str:
    """The inductor cache this process compiles into (TORCHINDUCTOR_CACHE_DIR, else inductor's
    default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def repair(cache: str | os.PathLike | None) -> list[str]:
    """Remove the damaged ELF files of the inductor cache folder `cache` (see the module's
    text); their names, relative to it."""
    if not cache or not os.path.isdir(cache):
        return []
    from filelock import FileLock, Timeout    # torch's own dependency, and inductor's lock

    root, removed = Path(cache), []
    now = time.time()
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(SUFFIXES) or dirpath == str(root / "locks"):
                continue
            path = Path(dirpath) / name
            lock_path = root / "locks" / (name.split(".", 1)[0] + ".lock")
            try:
                if not damaged(path) or (not lock_path.exists()
                                         and now - path.stat().st_mtime < QUIET_S):
                    continue
            except OSError:
                continue
            lock = FileLock(str(lock_path), timeout=0)
            try:
                with lock:
                    if damaged(path):
                        path.unlink()
                        removed.append(str(path.relative_to(root)))
            except (Timeout, OSError):
                continue                  # being built now, or not ours to remove
    return removed
