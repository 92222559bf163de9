"""A setup's process: one job in (a JSON argument), JSON lines out (stepbench.protocol).

`python -m stepbench.measure.worker '{"setup": {...}, "measure_peak": true}'`

The child always tries to end with a result message, also when the setup fails in Python: it
classifies the exception (oom, unsupported, error) itself, because only it can read the memory
in use at the failure. When it dies without one (a signal, an illegal memory access that kills
the CUDA context, a hang killed by the parent) the parent classifies the exit instead.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from stepbench import protocol
from stepbench.errors import Unsupported, first_line, out_of_memory
from stepbench.workload.spec import is_factory

# Messages that mean "this combination cannot run here", not "stepbench has a bug".
# oneDNN's words when it could not make a primitive: under a CPU memory cap, an allocation of
# its own that the cap refused (a step that needs more than the cap, like a tensor's that fails).
CAPPED_OOM_MARKERS = ("could not create a primitive",)
UNSUPPORTED_MARKERS = ("does not support backward on cpu", "not supported", "is not available",
                       "requires the package", "not installed", "flash_attn", "flash attention")


class Channel:
    """The protocol stream to the parent, on a private copy of stdout.

    fd 1 itself is pointed at stderr, so that whatever a library prints goes to the log and
    never into the protocol.
    """

    def __init__(self):
        self.stream = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        self.measured = {"phase": "starting"}

    def send(self, event: str, **fields) -> None:
        self.stream.write(protocol.encode(event, **fields))
        self.stream.flush()

    def progress(self, phase: str, *args, **info) -> None:
        """The phase the setup entered; called only between steps, never inside the timed
        window (the "timed" phase is sent once, before it starts)."""
        self.measured["phase"] = phase
        self.send("progress", phase=phase, args=list(args), **info)


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    channel = Channel()
    from stepbench.measure.phases import Phases
    from stepbench.setup import Setup

    setup = Setup.from_dict(job["setup"])
    phases = Phases(channel.measured)
    status, error = "ok", None
    try:
        from stepbench.measure import machine, models, step

        models.import_modeling(setup.model, setup.seq)
        if setup.mode == "compile":
            # torch.compile's stack, here rather than in the first step, so that the imports of
            # a fresh process are those a forked one was started with (the memory cap counts
            # from here).
            import torch._dynamo  # noqa: F401
            import torch._inductor.compile_fx  # noqa: F401
        phases.lap("imports")
        if setup.device == "cuda":
            step.torch.cuda.init()   # so that machine_info names the GPU through this context
        channel.send("start", machine=machine.machine_info(setup.device),
                     software=machine.software_info())
        # As a fresh process decides them (a forked one decides them again: execute/server.py).
        channel.measured["threads"] = {"intra_op": step.torch.get_num_threads(),
                                       "inter_op": step.torch.get_num_interop_threads()}
        if job.get("pin_cpus"):
            from stepbench.measure import pinning

            index = step.torch.cuda.current_device() if setup.device == "cuda" else 0
            channel.measured["cpu_pinning"] = pinning.pin(job["pin_cpus"], setup.device, index)
        phases.lap("device_init")
        probe = bool(job.get("probe"))
        peak = matmul_peak(setup, channel, cached_only=probe) if job.get("measure_peak") else None
        phases.lap("peak")
        limit_memory(setup, channel.measured)
        step.measure(setup, channel.measured, channel.progress, phases,
                     peak_tflops_measured=peak, cache_label=compile_cache_label(setup),
                     profile=job.get("profile"), probe=probe)
    except BaseException as exc:  # noqa: BLE001 - every failure is a result, never a lost setup
        if isinstance(exc, KeyboardInterrupt):
            raise
        status, error = classify_exception(exc, capped=setup.device == "cpu"
                                           and "memory_cap" in channel.measured)
        if status == "oom":
            channel.measured["oom_memory_gb"] = memory_in_use_gb(setup.device)
        if status == "error":
            traceback.print_exc()  # the parent keeps the stderr tail
            if is_factory(setup.model):
                # The user's code failed: the whole traceback stays with the record.
                channel.measured["traceback"] = traceback.format_exc()[-8000:]
    channel.send("result", status=status, error=error, measured=channel.measured)
    return 0


def matmul_peak(setup, channel: Channel, index: int = 0, cached_only: bool = False) -> float | None:
    """The GPU's matmul rate for mfu_measured: cached, or measured here before the model exists
    (and before --memory-limit-gb applies, which is about the setup, not this); `cached_only`
    (a search's measurement before its finals): the cached rate or None. A failure costs only
    mfu_measured."""
    if setup.device != "cuda":
        return None
    from stepbench.measure import peaks

    if not cached_only:   # a probe only reads the cache: no line says it measures
        channel.progress("peak")
    try:
        found = peaks.cached_matmul_tflops(setup.compute_dtype, index, measure=not cached_only)
        if found is None:
            return None
        tflops, measured_at = found
    except Exception as exc:  # noqa: BLE001 - the setup runs on without mfu_measured
        print(f"stepbench: measuring the matmul rate failed: {exc}", file=sys.stderr)
        return None
    finally:
        peaks.torch.cuda.empty_cache()   # the setup starts with nothing of it held
    channel.measured["peak_measured_at"] = measured_at
    return tflops


def classify_exception(exc: BaseException, capped: bool = False) -> tuple[str, str]:
    """(status, message) for an exception raised while building or stepping a setup; `capped`:
    under a CPU memory cap, where a library's own allocation that the cap refused is an oom too.

    torch.compile wraps errors raised inside the compiler, so the whole cause chain is searched.
    """
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for link in chain:
        text = str(link).lower()
        if out_of_memory(link) or (capped and any(m in text for m in CAPPED_OOM_MARKERS)):
            return "oom", f"{type(link).__name__}: {_first_line(link)}"
    for link in chain:
        text = str(link).lower()
        if isinstance(link, (NotImplementedError, ImportError)) or \
                any(m in text for m in UNSUPPORTED_MARKERS):
            # stepbench's own Unsupported is the reason itself ("unsupported: Unsupported: ..."
            # would say it twice); another library's exception keeps its name.
            named = "" if isinstance(link, Unsupported) else f"{type(link).__name__}: "
            return "unsupported", named + _first_line(link)
    return "error", f"{type(chain[0]).__name__}: {_first_line(chain[0])}"


def _first_line(exc: BaseException) -> str:
    return first_line(str(exc), 500) or repr(exc)


def limit_memory(setup, measured: dict | None = None) -> None:
    """Apply --memory-limit-gb: a fraction of the GPU, or on the CPU what the process may
    allocate from here on (after its imports, before the model is built: measure/memcap.py,
    RLIMIT_DATA where the kernel counts mappings against it, else the address space on one
    malloc arena); `measured` (the record body) keeps how (`memory_cap`). A cgroup's memory.max
    would count the same, but only a process placed in a cgroup before it starts can be held by
    one (the cgroup v2 rule that a cgroup with processes delegates no controller), which is not
    this process's to do."""
    if setup.memory_limit_gb is None:
        return
    limit_bytes = int(setup.memory_limit_gb * 1e9)
    if setup.device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total))
        cap = {"mechanism": "cuda_memory_fraction", "limit_gb": setup.memory_limit_gb}
    else:
        from stepbench.measure import memcap

        cap = {"limit_gb": setup.memory_limit_gb, **memcap.cap_cpu(limit_bytes),
               "timed_steps_capped": memcap.caps_timed_steps(setup.warmup)}
    if measured is not None:
        measured["memory_cap"] = cap


def compile_cache_label(setup) -> str | None:
    """How the inductor cache started: "shared" (user-given), "cold" (empty) or "warm"."""
    if setup.mode != "compile":
        return None
    if os.environ.get(protocol.CACHE_KIND_ENV) == "shared":
        return "shared"
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return "warm" if folder and os.path.isdir(folder) and os.listdir(folder) else "cold"


def memory_in_use_gb(device: str) -> float | None:
    from stepbench.measure.step import CpuMemory, CudaMemory

    try:
        return CudaMemory.in_use_gb() if device == "cuda" else CpuMemory.in_use_gb()
    except Exception:  # noqa: BLE001 - a broken CUDA context must not lose the oom row
        return None


if __name__ == "__main__":
    from stepbench.process import exit_now

    code = main(sys.argv[1:])
    # The result is sent: end now, without the interpreter's teardown, which took seconds of every
    # setup's wall time and measures nothing. The parent ends whatever the process group still holds.
    exit_now(code)
