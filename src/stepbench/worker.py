"""Child process entry: one Setup in (a JSON file), one measurement out (a JSON file).

`python -m stepbench.worker SETUP_JSON RESULT_JSON PROGRESS_FILE`

The child always tries to leave a result file, also when the setup fails in Python: it classifies
the exception (oom, unsupported, error) itself, because only it can read the memory in use at the
failure. When it dies without one (a signal, an illegal memory access that kills the CUDA context,
a hang killed by the parent) the parent classifies the exit instead (runner.classify).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")
# Messages that mean "this combination cannot run here", not "stepbench has a bug".
UNSUPPORTED_MARKERS = ("does not support backward on cpu", "not supported", "is not available",
                       "requires the package", "not installed", "flash_attn", "flash attention")


def main(argv: list[str]) -> int:
    setup_path, result_path, progress_path = (Path(a) for a in argv)
    from stepbench.setups import Setup

    setup = Setup.from_dict(json.loads(setup_path.read_text()))
    result = {"status": "ok", "error": None, "phase": "starting"}
    progress = ProgressFile(progress_path)
    try:
        limit_memory(setup)
        from stepbench import step

        step.measure(setup, result, progress)
    except BaseException as exc:  # noqa: BLE001 - every failure is a result, never a lost setup
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["status"], result["error"] = classify_exception(exc)
        if result["status"] == "oom":
            result["oom_memory_gb"] = memory_in_use_gb(setup.device)
        if result["status"] == "error":
            traceback.print_exc()  # the parent keeps the stderr tail
    write_json_atomic(result_path, result)
    return 0


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, message) for an exception raised while building or stepping a setup.

    torch.compile wraps errors raised inside the compiler, so the whole cause chain is searched.
    """
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    first = chain[0]
    message = f"{type(first).__name__}: {_first_line(first)}"
    for link in chain:
        text = str(link).lower()
        if _is_oom(link, text):
            return "oom", f"{type(link).__name__}: {_first_line(link)}"
    for link in chain:
        text = str(link).lower()
        if isinstance(link, (NotImplementedError, ImportError)) or any(m in text for m in UNSUPPORTED_MARKERS):
            return "unsupported", f"{type(link).__name__}: {_first_line(link)}"
    return "error", message


def _is_oom(exc: BaseException, text: str) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(m in text for m in OOM_MARKERS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else repr(exc)


def limit_memory(setup) -> None:
    """Apply --memory-limit-gb: a fraction of the GPU, or the address space of a CPU child."""
    if setup.memory_limit_gb is None:
        return
    limit_bytes = int(setup.memory_limit_gb * 1e9)
    if setup.device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total))
    else:
        # RLIMIT_AS counts virtual memory, which includes the imported libraries (about 2 GB for
        # torch); it is the only limit the kernel enforces per process without cgroups.
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def memory_in_use_gb(device: str) -> float | None:
    from stepbench.step import CpuMemory, CudaMemory

    try:
        return CudaMemory.in_use_gb() if device == "cuda" else CpuMemory.in_use_gb()
    except Exception:  # noqa: BLE001 - a broken CUDA context must not lose the oom row
        return None


class ProgressFile:
    """Tells the parent which phase the child is in, by rewriting one small file.

    Called only between steps, never inside the timed window (the "timed" phase is written once,
    before it starts).
    """

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, phase: str, *args, **info) -> None:
        write_json_atomic(self.path, {"phase": phase, "args": list(args), **info, "t": time.time()})


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
