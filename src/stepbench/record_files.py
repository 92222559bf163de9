"""The results files that `report`, `compare` and `predict` are given (files, folders of them),
and the records that count in them (record.py reads each file)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from stepbench.errors import UserError
from stepbench.record import Record, ResultsFile
from stepbench.record_checks import not_results


def load(paths: list[str], warn: Callable[[str], None]) -> list[Record]:
    """The records that count in every file and folder given (folders: their *.jsonl files), in
    argument order then line order. Across files, records of the same setup are kept side by
    side (repeats from several runs); within one file the latest of a setup wins."""
    return [r for found in load_each(paths, warn) for r in found]


def load_each(paths: list[str], warn: Callable[[str], None]) -> list[list[Record]]:
    """`load`'s records, one list per argument in `paths` (a file read twice is read once, in
    the first argument that names it)."""
    out, seen = [], set()
    for arg in paths:
        records = []
        for path in results_files([arg], warn):
            if path.resolve() in seen:
                warn(f"{path}: given more than once, read once")
                continue
            seen.add(path.resolve())
            problem = not_results(path)
            if problem:     # a gzip file, a CSV: one warning, not one for each of its lines
                warn(f"{path}: skipped, not a stepbench results file ({problem})")
                continue
            found = ResultsFile(path).latest(warn)
            if not found:
                warn(f"{path}: no usable records")
            records += found
        out.append(records)
    if not any(out):
        raise UserError("no usable records in " + ", ".join(map(str, paths)) +
                        "; pass results files written by `stepbench run`")
    return out


def results_files(paths: list[str], warn) -> list[Path]:
    """The results files that `paths` name (a folder: its *.jsonl files), each once; a path
    that is neither is a UserError."""
    found_files: list[Path] = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise UserError(f"folder '{path}' holds no results files (*.jsonl); pass the "
                                "folder that `stepbench run --out` wrote to, or the files")
            found_files += found
        elif path.is_file():
            found_files.append(path)
        else:
            raise UserError(f"results file '{path}' not found; pass results files (*.jsonl) "
                            "or folders of them")
    unique, seen = [], set()
    for path in found_files:
        if path.resolve() in seen:
            warn(f"{path}: given more than once, read once")
            continue
        seen.add(path.resolve())
        unique.append(path)
    return unique
