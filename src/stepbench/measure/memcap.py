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

Either way glibc's thresholds are fixed first (`fix_malloc`): by default its mmap threshold
rises to the size of each mapped block freed (up to 32 MiB) and its trim threshold to twice that,
at moments that depend on the order in which the threads freed blocks, so the heaps' layout, and
what a step held, differed by up to 8% between processes on a busy machine (issue 37, item 4;
benchmarks/README.md, section j3). Fixed at 128 KiB, every block of the step's size is mapped
and unmapped on free, the heaps keep only small ones, and the data memory of a step repeats, also
from one step to the next; a step is slower for it (FIXED_THRESHOLD). So the cap covers the
setup's build, first step and warm-up steps, which are the timed steps' computation, and
`release` lifts it before the timed steps (after them where there is no warm-up step), with the
thresholds raised to where an uncapped process's end up (RELEASED_THRESHOLD): the timed steps run at an
uncapped step's speed, and stepbench's own extra steps after them (the profiler's count of the
tensors, the FLOP counter), which need more than a step, are no part of what the cap asks.
"""

from __future__ import annotations

import ctypes
import mmap
import resource

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Both thresholds, fixed at glibc's starting value: every block from 128 KiB up is mapped, and
# unmapped when freed, so what a step holds does not depend on the heaps' layout. It costs speed:
# the blocks are faulted in again in every step (llama-tiny at batch 8 x 256: 1.65-1.75x the
# step time). Fixed at 32 MiB, where an uncapped process's threshold ends, a step cost nothing more,
# but fresh processes' heaps (address-space randomization) still moved the need by over 6%
# (benchmarks/README.md, section j3).
FIXED_THRESHOLD = 128 * 1024
# Where `release` leaves them: the mmap threshold where glibc's dynamic one stops rising (32 MiB
# on 64-bit), the trim threshold twice that, as an uncapped process's end up; fixed there, a
# step took the uncapped time (1.00x, benchmarks/README.md, section j3).
RELEASED_THRESHOLD = 32 * 1024 * 1024

_lifted: list = []    # (resource, limits before the cap) to restore in `release`
_fixed: list = []     # True once fix_malloc fixed the thresholds, for `release` to raise them


def cap_cpu(limit_bytes: int, count_mappings: bool | None = None) -> dict:
    """Cap this process's memory at `limit_bytes` more than it holds now, and return how
    (the record's `memory_cap`, without `limit_gb`). `count_mappings` forces the answer to
    "does RLIMIT_DATA count mappings here" (tests); None asks the kernel."""
    fixed = fix_malloc()
    before = resource.getrlimit(resource.RLIMIT_DATA)
    baseline = status_bytes("VmData")
    # Soft limits only: the process lifts them itself after its timed steps (`release`).
    resource.setrlimit(resource.RLIMIT_DATA, (baseline + limit_bytes, before[1]))
    if count_mappings is None:
        count_mappings = not mapping_fits(limit_bytes)
    if count_mappings:
        _lifted.append((resource.RLIMIT_DATA, before))
        return {"mechanism": "rlimit_data", "baseline_gb": round(baseline / 1e9, 4),
                "malloc_thresholds_kb": FIXED_THRESHOLD // 1024 if fixed else None}
    resource.setrlimit(resource.RLIMIT_DATA, before)
    one_arena = set_arena_max(1)
    before = resource.getrlimit(resource.RLIMIT_AS)
    baseline = status_bytes("VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (baseline + limit_bytes, before[1]))
    _lifted.append((resource.RLIMIT_AS, before))
    return {"mechanism": "rlimit_as", "baseline_gb": round(baseline / 1e9, 4),
            "why": "RLIMIT_DATA does not count mappings on this kernel",
            "malloc_arenas": 1 if one_arena else None,
            "malloc_thresholds_kb": FIXED_THRESHOLD // 1024 if fixed else None}


def caps_timed_steps(warmup: int) -> bool:
    """Whether a setup's timed steps run under the cap: only where no warm-up step ran before
    them (the warm-up steps are the timed steps' computation, so the cap is lifted after them)."""
    return not warmup


def release() -> None:
    """Lift the cap `cap_cpu` set, and raise glibc's thresholds to RELEASED_THRESHOLD (nothing
    where no cap was): before the setup's timed steps, after its warm-up ones."""
    while _lifted:
        which, limits = _lifted.pop()
        resource.setrlimit(which, limits)
    libc = _libc() if _fixed else None
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, RELEASED_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * RELEASED_THRESHOLD)
    _fixed.clear()


def fix_malloc() -> bool:
    """glibc's mmap and trim thresholds fixed at FIXED_THRESHOLD (no dynamic rise), and what the process
    already freed at the top of its heap given back, so that the baseline holds no spare room:
    False where the C library is not glibc."""
    libc = _libc()
    if libc is None:
        return False
    fixed = all(libc.mallopt(p, FIXED_THRESHOLD) == 1 for p in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
    libc.malloc_trim(0)
    _fixed.append(True)
    return fixed


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
    libc = _libc()
    return libc is not None and bool(libc.mallopt(M_ARENA_MAX, arenas))


def _libc():
    """The C library where it is glibc (it has mallopt and malloc_trim), else None. The
    process's own symbols: ctypes.util.find_library would start a compiler or ldconfig."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim    # noqa: B018 - AttributeError where not glibc
    except (OSError, AttributeError):
        return None
    return libc


def status_bytes(field: str) -> int:
    """A size from /proc/self/status (VmData: what RLIMIT_DATA counts; VmSize: RLIMIT_AS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")
