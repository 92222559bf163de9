"""The training step and the measuring loop. Runs in the child process only.

The step: random token ids, `loss = model(input_ids=x, labels=x).loss`, backward,
AdamW(lr=1e-4, fused), `zero_grad(set_to_none=True)`. The loop times the first step on its own (it
includes compilation), runs the warm-up steps, then the timed steps. On a GPU each timed step is
bracketed by a CUDA event pair and the host synchronizes once, after the last step: nothing inside
the timed window waits for the GPU, logs or calls hooks. On the CPU a step is synchronous, so
perf_counter around each step is exact.

`measure()` fills the `result` dict (the record's measured fields) as it goes, so that a failure
part-way (an out-of-memory error in the third warm-up step, say) still leaves what was measured
before it.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from stepbench import hostlead, workload
from stepbench.measure import (compile_info, inductor_cache, kernels, machine, memcap,  # noqa: F401
                               options, parallel, telemetry)
from stepbench.measure.phases import Phases
from stepbench.errors import first_line
from stepbench.noise import noise_flags_for
from stepbench.setup import Setup
from stepbench.workload.hf import flop_counter_per_sequence  # noqa: F401 - its old home

GB = 1e9

Progress = Callable[..., None]


def measure(setup: Setup, result: dict, progress: Progress, phases: Phases | None = None, *,
            peak_tflops_measured: float | None = None, cache_label: str | None = None,
            profile: str | None = None, probe: bool = False) -> None:
    """Build, compile if asked, and time `setup`; write every measured value into `result`.

    `phases` times each stage of the process (measure/phases.py); `peak_tflops_measured` is the
    device's matmul rate (for mfu_measured); `cache_label` says how the inductor cache started
    (worker.compile_cache_label); `profile`: where one more step's profile goes (`profile_step`);
    `probe`: a search's measurement before its finals, whose FLOP counter cross-check comes
    from its cache only.
    """
    phases = phases or Phases(result)
    device = torch.device(setup.device)
    cuda = device.type == "cuda"
    # A torchrun rank has set its own device (measure/distributed.py): read that one's telemetry.
    gpu_index = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
    # The CPU baseline is read before the build.
    memory = CudaMemory(setup.uses_cudagraphs) if cuda else CpuMemory()
    progress("building")
    if setup.mode == "compile":
        compile_info.watch_recompile_limit()
        repaired = inductor_cache.repair(inductor_cache.folder())
        if repaired:
            shown = ", ".join(repaired[:3]) + (", ..." if len(repaired) > 3 else "")
            result.setdefault("notes", []).append(
                f"inductor cache: removed {len(repaired)} damaged file(s) that a compile killed "
                f"mid-way had left ({shown})")
    work, step, optimizer = build_workload(setup, device)
    model = work.model
    result["params"] = sum(p.numel() for p in model.parameters())
    result.update(work.record_fields())
    if setup.distributed:
        result["wrapping"] = parallel.wrapping(setup, work.shard_units())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    progress("first_step", compiling=setup.mode == "compile")
    rng_before = rng_states(cuda)
    # The phase "first_step" is the step itself, read off the same two clock readings as
    # first_step_s (the progress message and the bookkeeping around it go to its neighbours).
    start = time.perf_counter()
    phases.lap("build", start)
    losses = [step()]
    sync()
    end = time.perf_counter()
    result["first_step_s"] = end - start
    phases.lap("first_step", end)
    if drew_random(rng_before, rng_states(cuda)):
        result["draws_random"] = True
    result["loss_first"] = losses[0].item()
    frames_after_first = compile_info.frames_compiled()

    for i in range(setup.warmup):
        progress("warmup", i + 1, setup.warmup)
        losses.append(step())
    sync()
    if not memcap.caps_timed_steps(setup.warmup):
        # --memory-limit-gb on a CPU: the first and warm-up steps, the timed steps' computation,
        # ran capped; the timed ones run at an uncapped step's speed (measure/memcap.py).
        memcap.release()
    phases.lap("warmup")

    progress("timed", setup.steps)
    frames_before_timed = compile_info.frames_compiled()
    other_procs = telemetry.other_processes(gpu_index) if cuda else None
    memory.reset()
    # A torchrun job's ranks share the CPUs on purpose: they are not other processes' load.
    cpu_watched = not cuda and not setup.distributed
    gpu_start = telemetry.gpu_snapshot(gpu_index) if cuda else None
    cpu_start = telemetry.cpu_snapshot() if cpu_watched else None
    window_start = time.perf_counter()
    leads: dict = {}
    step_times_ms = timed_steps(step, setup.steps, cuda, losses, leads)
    result["timed_wall_s"] = time.perf_counter() - window_start
    cpu_end = telemetry.cpu_snapshot() if cpu_watched else None
    gpu_end = telemetry.gpu_snapshot(gpu_index) if cuda else None
    result.update(memory.peaks())
    frames_after_timed = compile_info.frames_compiled()

    result["losses"] = [float(v) for v in torch.stack(losses).float().cpu()]
    result["loss_last"] = result["losses"][-1]
    result.update(step_time_summary(step_times_ms, work.units_per_batch))
    phases.lap("timed")
    # Without warm-up steps the timed ones ran capped; the counting below never does.
    memcap.release()
    progress("done")

    # Everything below reads what the window left behind; nothing here is timed.
    flags = noise_flags_for(step_times_ms)
    if leads:
        result.update(leads)
        if hostlead.host_bound(leads["host_lead_ms"], result["step_ms_median"]):
            flags.append("host_bound")
    if cuda:
        result["telemetry"] = telemetry.telemetry_record(gpu_start, gpu_end, other_procs)
        result["energy"] = telemetry.energy_over_window(gpu_start, gpu_end, setup.steps,
                                                        work.units_per_batch, result["timed_wall_s"])
        flags += telemetry.noise_flags(gpu_start, gpu_end, other_procs)
    elif cpu_watched:
        result["telemetry"] = telemetry.cpu_telemetry(cpu_start, cpu_end,
                                                      torch.get_num_threads())
        flags += telemetry.cpu_noise_flags(result["telemetry"])
    if setup.mode == "compile":
        result["compile"] = compile_info.diagnostics(frames_after_first, frames_before_timed,
                                                     frames_after_timed, cache_label)
        if result["compile"]["recompiles_in_timed"]:
            flags.append("recompiled")
    result["noise_flags"] = flags
    phases.lap("after")
    if profile:
        try:
            result["profile"] = profile_step(step, profile, cuda)
        except Exception as exc:  # noqa: BLE001 - a profile must not cost the measurement
            print(f"stepbench: profiling one more step failed: {exc}", file=sys.stderr)
            result["profile"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        phases.lap("profile")
    if not cuda and not setup.distributed:
        add_fields(result, memory.tensors_peak(step, held_tensors(model, optimizer, work.held())))
        phases.lap("memory")
    add_fields(result, work.flop_fields(setup, result["tokens_per_s"], peak_tflops_measured,
                                        count=not probe))
    phases.lap("flops")


def add_fields(result: dict, fields: dict) -> None:
    """`fields` into the record body `result`, their `notes` after the notes it has."""
    notes = fields.pop("notes", None)
    if notes:
        result["notes"] = [*result.get("notes", []), *notes]
    result.update(fields)


def rng_states(cuda: bool) -> list[torch.Tensor]:
    """The default generators' states (the CPU's, and the current GPU's)."""
    return [torch.get_rng_state(), *([torch.cuda.get_rng_state()] if cuda else [])]


def drew_random(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    """Whether a step between the two readings drew random numbers (dropout): eager and
    compiled code draw them differently, so the loss guard cannot compare their losses."""
    return any(not torch.equal(a, b) for a, b in zip(before, after))


def build(setup: Setup, device: torch.device):
    """The model (random weights from the seed, drawn where Setup.init says), its training step,
    the inputs of a step and the optimizer; `build_workload` also returns the workload."""
    work, step, optimizer = build_workload(setup, device)
    return work.model, step, work.inputs, optimizer


def build_workload(setup: Setup, device: torch.device):
    """(the workload built: workload.base.Built, the training step, the optimizer)."""
    options.check_supported(setup)
    torch.manual_seed(setup.seed)
    work = workload.build(setup, device, parallel.rank())
    model = work.model
    options.apply_options(model, setup, checkpoint=work.enable_checkpointing)
    if not model.training:
        # A model handed over in eval mode (from_pretrained's) trains; one in training mode keeps
        # its parts' own modes (a frozen backbone's BatchNorm in eval, as fine-tuning runs it).
        model.train()
    if setup.distributed:
        # DDP wraps, FSDP2 shards in place (and compiles per layer): the optimizer is made after.
        forward = parallel.wrap(setup, model, layers=work.layers, units=work.shard_units())
    else:
        forward = options.compile_model(model, setup, layers=work.layers)
    optimizer = work.make_optimizer(setup)
    cudagraphs = setup.uses_cudagraphs

    def step() -> torch.Tensor:
        if cudagraphs:
            # CUDA graph trees replay into the same output buffers: mark where a step begins,
            # and keep a copy of the loss, which the next replay would overwrite.
            torch.compiler.cudagraph_mark_step_begin()
        with options.forward_context(setup):
            loss = work.loss(forward)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone() if cudagraphs else loss.detach()

    return work, step, optimizer


def profile_step(step, stem: str, cuda: bool) -> dict:
    """One more step, after the timed ones, under torch.profiler (CPU and CUDA activities): its
    trace as `stem`.json.gz (chrome://tracing, Perfetto) and its key_averages table, top 40 by
    device time (CPU time on a CPU), as `stem`.txt. The paths, the step's wall time (longer
    than a timed step: the profiler records every op) and, on a GPU, the sum of its kernels'
    times (`device_s`; below the wall time where the GPU waited for the host); the kernel
    classes and the GEMMs by shape (measure/kernels.py)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    trace, table = f"{stem}.json.gz", f"{stem}.txt"
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    # Shapes and FLOPs of each op: the GEMMs' table (measure/kernels.py `gemms`).
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - start
    prof.export_chrome_trace(trace)
    by = "device_time_total" if cuda else "cpu_time_total"
    averages = prof.key_averages()
    # The device's own events (kernels, copies), as the table's "Self CUDA time total" sums them.
    device_s = sum(e.self_device_time_total for e in averages
                   if e.device_type != torch.autograd.DeviceType.CPU
                   and not getattr(e, "is_user_annotation", False)) / 1e6 if cuda else None
    head = f"# one training step ({wall_s * 1000:.1f} ms with the profiler" + (
        f"; kernels {device_s * 1000:.1f} ms" if cuda else "") + f"), key_averages by {by}\n"
    Path(table).write_text(head + averages.table(sort_by=by, row_limit=40) + "\n")
    return {"trace": trace, "table": table, "step_s": wall_s, "device_s": device_s,
            **kernels.split_trace(trace)}


def held_tensors(model, optimizer, inputs) -> list[torch.Tensor]:
    """What a step keeps between steps: weights, buffers, the optimizer's state, the inputs (a
    tensor, or a list of them; gradients are freed by zero_grad(set_to_none=True))."""
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    inputs = [inputs] if torch.is_tensor(inputs) else list(inputs)
    return [*model.parameters(), *model.buffers(), *state, *inputs]


def timed_steps(step, steps: int, cuda: bool, losses: list,
                leads: dict | None = None) -> list[float]:
    """Run `steps` steps and return each one's time in ms; losses stay on the device.

    GPU: a CUDA event pair around each step and one synchronize after the last, so the host never
    waits inside the window; inside it only a host clock reading per step, for the host's lead
    (hostlead.py), written into `leads`. CPU: a step is synchronous, so perf_counter around it is
    exact, and the device never trails the host: `leads` stays empty.
    """
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(steps)]
        # The anchor puts the GPU's events on the host's clock (hostlead.py): recorded on an
        # idle GPU, seen complete, the host clock read on both sides; all before the window.
        anchor = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        before = time.perf_counter()
        anchor.record()
        anchor.synchronize()
        after = time.perf_counter()
        enqueued = []
        for begin, end in events:
            begin.record()
            losses.append(step())
            end.record()
            enqueued.append(time.perf_counter())   # the step's work enqueued; nothing waits
        torch.cuda.synchronize()
        if leads is not None:
            leads.update(hostlead.host_leads((before, after),
                                             [anchor.elapsed_time(end) for _, end in events],
                                             enqueued))
        return [begin.elapsed_time(end) for begin, end in events]
    step_times_ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        step_times_ms.append((time.perf_counter() - t0) * 1000)
    return step_times_ms


def step_time_summary(step_times_ms: list[float], tokens_per_step: int) -> dict:
    """Mean, median, spread and tokens/s of the timed steps."""
    mean = statistics.fmean(step_times_ms)
    return {
        "step_times_ms": step_times_ms,
        "step_ms": mean,
        "step_ms_median": statistics.median(step_times_ms),
        "step_ms_min": min(step_times_ms),
        "step_ms_max": max(step_times_ms),
        "step_ms_std": statistics.stdev(step_times_ms) if len(step_times_ms) > 1 else 0.0,
        "tokens_per_s": tokens_per_step / (mean / 1000),
    }


class CudaMemory:
    """Peak allocated/reserved over the timed window (max_memory_allocated, as the original
    experiment measured it).

    Under CUDA graphs (compile modes reduce-overhead and max-autotune) a replay allocates nothing:
    the graphs' memory pool was reserved while they were recorded, before the window, so
    max_memory_allocated reads only what lives outside the pool (a third of the peak without graphs,
    docs/architecture.md, "Measured reasons"). There the peak is the caching allocator's peak
    reserved memory, pool included, which is what the card must hold; `peak_memory_source` says so.
    Reserved memory also holds the allocator's free blocks, so it reads a little above allocated
    (within 1% for compile+sdpa).
    """

    def __init__(self, cudagraphs: bool = False):
        self.cudagraphs = cudagraphs

    def reset(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peaks(self) -> dict:
        allocated = torch.cuda.max_memory_allocated() / GB
        reserved = torch.cuda.max_memory_reserved() / GB
        if self.cudagraphs:
            return {"peak_memory_gb": reserved, "peak_reserved_gb": reserved,
                    "peak_allocated_gb": allocated, "peak_memory_source": "max_memory_reserved"}
        return {"peak_memory_gb": allocated, "peak_reserved_gb": reserved}

    @staticmethod
    def in_use_gb() -> float:
        return torch.cuda.memory_allocated() / GB


class CpuMemory:
    """A CPU step's memory: the peak of its tensors (`peak_memory_gb`, as max_memory_allocated
    counts them on a GPU) and the process's peak resident set over the timed window
    (`peak_reserved_gb`).

    The tensors are counted by the allocator, not by resident memory: what the step holds
    between steps (weights, buffers, optimizer state, tokens: `held_tensors`) plus the peak of
    what it allocates in one more step after the window (gradients, activations, temporaries),
    from torch.profiler's memory events, whose running sum is the net allocation. Resident
    memory cannot give this number: with two or more threads, glibc's heaps keep freed memory
    in a layout that depends on how the threads were scheduled, so on a busy machine the same
    setup's resident growth varies between processes, and a forked process counts the server's
    file pages it touches (docs/architecture.md, "Measured reasons").

    Writing 5 to /proc/self/clear_refs resets the kernel's peak RSS (ru_maxrss) to the current
    RSS, so the resident peak read after the window is the window's own. Where the profiler
    cannot count (a torchrun rank, whose extra step the other ranks would have to join), the
    peak is the resident growth over the window above what the process held before the model
    was built, as stepbench measured it before (`peak_memory_source` null).
    """

    def __init__(self):
        self.baseline_bytes = self.in_use_gb() * GB

    def reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def peaks(self) -> dict:
        peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return {"peak_memory_gb": max(peak_bytes - self.baseline_bytes, 0) / GB,
                "peak_reserved_gb": peak_bytes / GB}

    @staticmethod
    def tensors_peak(step, held: list[torch.Tensor]) -> dict:
        """One more step under torch.profiler's memory events: the held tensors' bytes plus the
        step's peak net allocation (`peak_memory_source` "tensors"); {} when the profiler cannot
        count (the resident peak stands) but a note saying why."""
        from torch.profiler import ProfilerActivity, profile

        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            events = prof.profiler.kineto_results.events()
            deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
        except Exception as exc:  # noqa: BLE001 - the resident peak is kept instead
            print(f"stepbench: counting the step's tensors failed: {exc}", file=sys.stderr)
            # Said in the record: under a --memory-limit-gb cap a step that fit may not fit
            # again beside the profiler, and the peak is then another measure of memory.
            return {"notes": ["peak memory is the resident growth, not the step's tensors: "
                              f"counting them failed ({first_line(f'{type(exc).__name__}: {exc}', 160)})"]}
        running = peak = 0
        for _, nbytes in deltas:
            running += nbytes
            peak = max(peak, running)
        return {"peak_memory_gb": (sum(storages.values()) + peak) / GB,
                "peak_memory_source": "tensors"}

    @staticmethod
    def in_use_gb() -> float:
        import psutil

        return psutil.Process().memory_info().rss / GB
