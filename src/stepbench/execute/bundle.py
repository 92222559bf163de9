"""This very stepbench as a wheel, to install on an SSH host (execute/hosts/ssh.py).

The wheel is zipped here from the package that is running, not built by a build backend: that
works the same from a checkout, an editable install or an installed wheel, needs no setuptools or
network on this machine, and never writes into a checkout. Its bytes depend only on the files
(fixed timestamps, sorted names), so the same code gives the same wheel and the host's prepared
environment, named by its hash, is reused by every later run.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import stepbench
from stepbench import __version__

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
