"""What travels to another machine: this stepbench as a wheel, and a user's workload files.

The wheel: this very stepbench, to install on an SSH host (execute/hosts/ssh.py).

The wheel is zipped here from the package that is running, not built by a build backend: that
works the same from a checkout, an editable install or an installed wheel, needs no setuptools or
network on this machine, and never writes into a checkout. Its bytes depend only on the files
(fixed timestamps, sorted names), so the same code gives the same wheel and the host's prepared
environment, named by its hash, is reused by every later run.

The workload's files: what a remote job carries for a user's factory (`--model FILE.py:FUNCTION`,
docs/workloads.md): the file, or with `--workload-dir DIR` that whole folder, at the same path
relative to a working folder, so that the setup's `model` (its identity, never rewritten)
resolves there as it does here.

`carried(settings, what)` gathers it (None where no setup's model is a factory file: a preset,
a config, or a `package.module:FUNCTION` imported as it is installed on the other side). The
files keep their paths relative to this process's working folder; a path that climbs above it
(`../models/net.py`) is kept by running the job in a folder as deep below the carried root
(`CWD`): `../models/net.py` from `.stepbench-cwd/` is `models/net.py`. An absolute path does
not travel: it is refused in one line (Slurm, whose nodes share this filesystem, does not
carry anything and takes it as it is).

SSH hosts and rented machines get it as a tar (`archive()`, unpacked by hostprep under
`<--remote-dir>/workloads/<sha>/`), Ray as its job's `working_dir` (`write(folder)`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath

import stepbench
from stepbench import __version__
from stepbench.errors import UserError

PACKAGE = Path(stepbench.__file__).resolve().parent
SOURCE_ROOT = PACKAGE.parents[1]        # the checkout, when this runs from one (src layout)
EPOCH = (1980, 1, 1, 0, 0, 0)           # the earliest time a zip file can hold


@dataclass(frozen=True)
class Wheel:
    filename: str
    data: bytes
    requires: tuple[str, ...]           # the runtime requirements, installed on the host if missing

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def requirements() -> list[str]:
    """The runtime requirements: from the checkout's pyproject.toml when this runs from one
    (the installed metadata may be older than the code), else from the installed metadata."""
    pyproject = SOURCE_ROOT / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "stepbench":
            return list(project.get("dependencies", []))
    try:
        found = metadata.requires("stepbench") or []
    except metadata.PackageNotFoundError:
        return []
    return [r for r in found if "extra ==" not in r]


def build() -> Wheel:
    """A pure-Python wheel of the running stepbench package."""
    requires = requirements()
    dist_info = f"stepbench-{__version__}.dist-info"
    files = {f"stepbench/{path.relative_to(PACKAGE).as_posix()}": path.read_bytes()
             for path in sorted(PACKAGE.rglob("*"))
             if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}
    files[f"{dist_info}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\nName: stepbench\n", f"Version: {__version__}\n",
         "Requires-Python: >=3.11\n"] + [f"Requires-Dist: {r}\n" for r in requires]).encode()
    files[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: stepbench.execute.bundle\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return Wheel(f"stepbench-{__version__}-py3-none-any.whl", buffer.getvalue(), tuple(requires))


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


CWD = ".stepbench-cwd"          # the job's working folder below the root, per `..` climbed
LIMIT_BYTES = 100 * 2**20       # Ray's own limit on a working_dir; the same for every backend
SKIP_DIRS = {"__pycache__"}     # and every folder whose name starts with a dot (.git, .venv)


@dataclass(frozen=True)
class Carried:
    """The files a job carries, by their path below the carried root, and the job's working
    folder below that root ("." or CWD/CWD/...)."""

    files: dict[str, bytes] = field(default_factory=dict)
    cwd: str = "."
    sources: tuple[str, ...] = ()       # what was asked to travel, as given (for the notes)

    @property
    def sha(self) -> str:
        digest = hashlib.sha256(self.cwd.encode())
        for name in sorted(self.files):
            digest.update(b"\0" + name.encode() + b"\0")
            digest.update(hashlib.sha256(self.files[name]).digest())
        return digest.hexdigest()[:16]

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())

    def archive(self) -> bytes:
        """The files as an uncompressed tar whose bytes depend only on them (sorted names, no
        times, no owners)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.files):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(self.files[name]), 0o644, 0
                tar.addfile(info, io.BytesIO(self.files[name]))
        return buffer.getvalue()

    def write(self, root: Path) -> Path:
        """Write the files under `root` (and the working folder); the working folder."""
        for name, data in self.files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        cwd = root / self.cwd
        cwd.mkdir(parents=True, exist_ok=True)
        return cwd

    def describe(self) -> str:
        """One line for the run's notes: what travels."""
        size = f"{self.size} bytes" if self.size < 1024 else f"{self.size / 1024:,.0f} KiB"
        return (f"carries {', '.join(self.sources)} ({len(self.files)} "
                f"file{'s' if len(self.files) != 1 else ''}, {size})")


def factory_files(models) -> list[str]:
    """The `FILE.py` of every factory among `models` (a name, a list of names, or None)."""
    from stepbench.workload.loader import is_factory, split

    names = models if isinstance(models, (tuple, list)) else [models]
    files = [split(m)[0] for m in names if is_factory(m)]
    return list(dict.fromkeys(f for f in files if f.endswith(".py")))


def carried(settings, what: str) -> Carried | None:
    """What the settings' factory files need carried to `what` (e.g. "SSH hosts"), or None."""
    return gather(settings.values.get("model"), getattr(settings, "workload_dir", None), what)


def gather(models, workload_dir=None, what: str = "the remote machines") -> Carried | None:
    files = factory_files(models)
    if not files:
        return None
    here = Path.cwd()
    folder = Path(workload_dir).resolve() if workload_dir is not None else None
    sources: dict[str, Path] = {}       # the path as given (relative) -> what it names here
    for file in files:
        if Path(file).is_absolute():
            raise UserError(f"--model {file}: an absolute path does not travel to {what}; pass "
                            "it relative to this folder (run stepbench from a folder above it)")
        if folder is not None and _holds(folder, file):
            sources.setdefault(os.path.relpath(folder, here), folder)
        else:
            _check_alone(file, what)
            sources.setdefault(os.path.normpath(file), here / file)
    depth = max(_climbs(given) for given in sources)
    cwd = PurePosixPath(*([CWD] * depth)) if depth else PurePosixPath(".")
    chosen: dict[str, Path] = {}        # the path below the root -> the file here
    for given, path in sources.items():
        target = PurePosixPath(os.path.normpath(str(cwd / PurePosixPath(Path(given).as_posix()))))
        if path.is_dir():
            for inner in sorted(path.rglob("*")):
                relative = inner.relative_to(path)
                if inner.is_file() and not any(p in SKIP_DIRS or p.startswith(".")
                                               for p in relative.parts[:-1]) \
                        and inner.suffix != ".pyc":
                    chosen[str(target / relative.as_posix())] = inner
        else:
            chosen[str(target)] = path
    size = sum(path.stat().st_size for path in chosen.values())
    if size > LIMIT_BYTES:      # said before anything is read
        name, path = max(chosen.items(), key=lambda item: item[1].stat().st_size)
        raise UserError(f"{', '.join(sources)} holds {size / 2**20:.0f} MiB (the largest file: "
                        f"{os.path.relpath(path, here)}, {path.stat().st_size / 2**20:.0f} MiB); "
                        f"a job carries at most {LIMIT_BYTES // 2**20} MiB to {what}: pass a "
                        "--workload-dir with the code alone")
    return Carried({name: path.read_bytes() for name, path in chosen.items()}, str(cwd),
                   tuple(sources))


def _check_alone(file: str, what: str) -> None:
    """Refuse a factory file that travels alone but imports a module beside it: there the import
    would fail in every setup (`No module named 'helper'`), and the fix is --workload-dir. Only
    the module's top-level imports count (one in a try block may have a fallback)."""
    import ast

    path = Path(file)
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return          # the factory's own check says what is wrong with the file
    names = [alias.name for node in tree.body if isinstance(node, ast.Import)
             for alias in node.names]
    names += [node.module or "" for node in tree.body
              if isinstance(node, ast.ImportFrom) and node.level == 0]
    for name in dict.fromkeys(n.split(".")[0] for n in names if n):
        if (path.parent / f"{name}.py").is_file() or \
                (path.parent / name / "__init__.py").is_file():
            folder = os.path.normpath(path.parent)
            raise UserError(f"--model {file} imports {name}, which sits beside it and does "
                            f"not travel to {what} with the file alone; pass --workload-dir "
                            f"{folder} (the folder that holds both) so that it travels too")


def _holds(folder: Path, file: str) -> bool:
    return folder in Path(file).resolve().parents


def _climbs(given: str) -> int:
    """How many leading `..` a normalised relative path has."""
    parts = PurePosixPath(Path(given).as_posix()).parts
    return next((i for i, part in enumerate(parts) if part != ".."), len(parts))
