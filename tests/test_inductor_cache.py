"""measure/inductor_cache.py: what a compile killed mid-way leaves in inductor's cache is removed
before the next compile, and nothing else is (a whole file, one being built under its lock, one
some other builder may still be writing)."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from stepbench.measure import inductor_cache

ELF = Path(os.path.realpath(sys.executable))     # a real, whole ELF file


def test_a_whole_elf_file_is_not_damaged_and_any_cut_of_it_is(tmp_path):
    if ELF.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("this Python is not an ELF binary")
    whole = tmp_path / "whole.so"
    shutil.copy(ELF, whole)
    assert not inductor_cache.damaged(whole)
    data = whole.read_bytes()
    for size in (0, 10, 63, 64, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{size}.so"
        cut.write_bytes(data[:size])
        assert inductor_cache.damaged(cut), size
    # The linker writes the header last: a file of the right size whose header is still zeros.
    zeros = tmp_path / "zeros.o"
    zeros.write_bytes(b"\0" * 64 + data[64:])
    assert inductor_cache.damaged(zeros)


def _cache(tmp_path, *names, lock=True):
    root = tmp_path / "inductor"
    (root / "locks").mkdir(parents=True, exist_ok=True)
    for name in names:
        path = root / name[1:3] / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"")
        if lock:
            (root / "locks" / (name.split(".", 1)[0] + ".lock")).touch()
    return root


def test_repair_removes_what_a_killed_compile_left_and_keeps_the_rest(tmp_path):
    root = _cache(tmp_path, "cabkilled.main.so", "cabkilled.kernel.o")
    whole = root / "cd" / "ccdwhole.main.so"
    whole.parent.mkdir()
    shutil.copy(ELF, whole)
    source = root / "ab" / "cabkilled.main.cpp"      # not a build product: never looked at
    source.write_text("")
    assert sorted(inductor_cache.repair(root)) == ["ab/cabkilled.kernel.o", "ab/cabkilled.main.so"]
    assert whole.exists() and source.exists()
    assert inductor_cache.repair(root) == [] and inductor_cache.repair(tmp_path / "none") == []


def test_a_file_being_built_under_inductors_lock_is_left_alone(tmp_path):
    root = _cache(tmp_path, "cefbuilding.main.so")
    with FileLock(str(root / "locks" / "cefbuilding.lock")):    # another process's build
        assert inductor_cache.repair(root) == []
    assert inductor_cache.repair(root) == ["ef/cefbuilding.main.so"]


def test_a_file_without_inductors_lock_is_removed_only_once_it_stopped_changing(tmp_path):
    root = _cache(tmp_path, "cghother.so", lock=False)
    path = root / "gh" / "cghother.so"
    assert inductor_cache.repair(root) == []            # just written: maybe still being written
    old = time.time() - 2 * inductor_cache.QUIET_S
    os.utime(path, (old, old))
    assert inductor_cache.repair(root) == ["gh/cghother.so"]
