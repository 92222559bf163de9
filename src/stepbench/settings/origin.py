"""Where a setting's value came from (a flag, a plan file's key, the default), so that an error
names it as the user wrote it; and the checks of paths that settings name."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from stepbench.errors import UserError


@dataclass(frozen=True)
class Origin:
    """Where each setting given came from, so that an error names it as the user wrote it: a
    flag (`--compile-scope layer needs torch.compile`), or a plan file's key as the plan spells
    it, after the plan's name (`plan study.toml: compile_scope layer needs torch.compile`).
    Keys are settings keys (axes.Axis.key, Setting.key); a key's flag is `--` and its dashed
    form, as cli/flags.py makes them."""

    plan: Path | None = None
    # The keys the plan gave and no flag overrode -> the plan's spelling ("compile-scope",
    # "compile_scope", or an alias: "mode").
    spelled: Mapping[str, str] = field(default_factory=dict)
    flagged: frozenset = frozenset()    # the keys the flags gave

    def where(self, key: str) -> str | None:
        """The plan's spelling of `key`, when the plan gave it; None for a flag or a default."""
        return self.spelled.get(key)

    def name(self, key: str, about: str | None = None) -> str:
        """How an error names `key`: as it was given (its flag, or the plan's spelling, with
        the plan's name where the error is `about` a flag); a key not given at all in the style
        of the key the error is `about` (the plan's own way where the plan gave that one: the
        fix goes in the plan)."""
        flag = "--" + key.replace("_", "-")
        if key in self.flagged:
            return flag
        if key in self.spelled:
            return self.spelled[key] + ("" if about is None or about in self.spelled
                                        else f" in plan {self.plan}")
        return key.replace("_", "-") if about in self.spelled else flag

    def error(self, about: str, message: str, kind: str | None = None) -> UserError:
        """A UserError (of `kind`) about the value of `about`, headed by the plan's name when
        the plan gave that value."""
        return UserError(f"plan {self.plan}: {message}" if about in self.spelled else message,
                         kind=kind)

    @contextmanager
    def checking(self, key: str):
        """A UserError raised within about `key`'s value is headed by the plan's name when the
        plan gave it (the message names the key by `where(key)`)."""
        try:
            yield
        except UserError as exc:
            if key not in self.spelled:
                raise
            raise UserError(f"plan {self.plan}: {exc}", kind=exc.kind) from None


def writable_folder(path: Path, flag: str, make: bool = False) -> Path:
    """`path` as a folder stepbench can write into: there, or makeable under a folder there;
    else a UserError naming `flag`. With `make`, the folder is made (a dry run only checks)."""
    path = Path(path).expanduser()
    fix = f"pass {flag} a folder you can write to"
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; {fix}")
    there = next(p for p in (path, *path.parents) if p.exists())
    if not there.is_dir():
        raise UserError(f"{flag} {path} cannot be made: {there} is a file; {fix}")
    if make:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{flag} {path} cannot be made ({exc.strerror}); {fix}") from None
        there = path
    if not os.access(there, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path} is not writable ({there}: permission denied); {fix}")
    return path


def read_file(path: Path, what: str, fix: str) -> str:
    """The text of the file a flag names, or a UserError ("cannot read plan p.toml (...);
    FIX"): one that is not there, cannot be read, or is a pipe or a device (reading one would
    wait for a writer, or never end)."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file() and not path.is_dir():
            raise UserError(f"cannot read {what} {path} (not a regular file: a pipe or a "
                            f"device); {fix}")
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} {path} ({getattr(exc, 'strerror', None) or exc}); "
                        f"{fix}") from None


def read_hosts_file(path: Path) -> list[str]:
    """One host a line (alias or user@host[:port]); blank lines and # comments are skipped."""
    lines = read_file(path, "hosts file", "pass a text file with one host a line").splitlines()
    hosts = [h for h in (line.split("#", 1)[0].strip() for line in lines) if h]
    if not hosts:
        raise UserError(f"hosts file {path} names no host; write one alias or user@host[:port] "
                        "a line")
    return hosts


__all__ = ["Origin", "writable_folder", "read_file", "read_hosts_file"]
