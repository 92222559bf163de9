"""--memory-limit-gb on a CPU: a cap on what the setup's process allocates from here on, whose
outcome does not depend on what the process (or the process server it was forked from) did
before.

The cap is RLIMIT_DATA over the process's data memory now (VmData: its heap and private
writable mappings, what malloc and torch's allocator take). Since Linux 4.7 the kernel counts
both the heap and every private writable mapping against it, so a block counts whether glibc
takes it from the heap or maps it for itself; reservations that are not writable (the address
space glibc reserves for each thread's arena, thread stacks' guard pages) are not counted until
they are used. RLIMIT_AS, used before, counted those reservations too, which threads make in an
order that varies from run to run (issue 37).

Some kernels (gVisor's, an older Linux) hold only the heap (brk) to RLIMIT_DATA. There a block
counts only where glibc takes it from the heap, which depends on glibc's dynamic mmap threshold,
that is on what the process freed before: the same setup ended oom alone and ok after other
work. So the kernel is asked first: right after the limit is set, a private writable mapping
larger than the whole cap is requested. Where the kernel grants it, mappings are not counted,
and the cap is the address space instead (RLIMIT_AS over VmSize now) with every thread on one
malloc arena (M_ARENA_MAX 1), so that no arena reservation of a thread started later moves it;
what remains counted beyond the step's own memory (the stacks of the threads it starts) is the
same each time the setup runs. Forcing every block onto the heap (M_MMAP_MAX 0) made the outcome
deterministic too, but the heap fragmented over steps, so a batch that fitted in a short probe
ran out in a longer measurement (git 2d86cbb, reverted).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import resource

M_ARENA_MAX = -8        # glibc's mallopt parameter (malloc.h)


def cap_cpu(limit_bytes: int, count_mappings: bool | None = None) -> dict:
    """Cap this process's memory at `limit_bytes` more than it holds now, and return how
    (the record's `memory_cap`, without `limit_gb`). `count_mappings` forces the answer to
    "does RLIMIT_DATA count mappings here" (tests); None asks the kernel."""
    before = resource.getrlimit(resource.RLIMIT_DATA)
    baseline = status_bytes("VmData")
    cap = baseline + limit_bytes
    resource.setrlimit(resource.RLIMIT_DATA, (cap, before[1]))   # the hard limit once decided
    if count_mappings is None:
        count_mappings = not mapping_fits(limit_bytes)
    if count_mappings:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
        return {"mechanism": "rlimit_data", "baseline_gb": round(baseline / 1e9, 4)}
    resource.setrlimit(resource.RLIMIT_DATA, before)
    one_arena = set_arena_max(1)
    baseline = status_bytes("VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (baseline + limit_bytes, baseline + limit_bytes))
    return {"mechanism": "rlimit_as", "baseline_gb": round(baseline / 1e9, 4),
            "why": "RLIMIT_DATA does not count mappings on this kernel",
            "malloc_arenas": 1 if one_arena else None}


def mapping_fits(limit_bytes: int) -> bool:
    """Whether a private writable mapping larger than the whole cap is granted (never touched,
    so it costs no memory): then the kernel does not hold mappings to RLIMIT_DATA."""
    try:
        block = mmap.mmap(-1, limit_bytes + (64 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return False
    block.close()
    return True


def set_arena_max(arenas: int) -> bool:
    """glibc's mallopt(M_ARENA_MAX): False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmData: what RLIMIT_DATA counts; VmSize: RLIMIT_AS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")
