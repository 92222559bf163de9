"""Which setup and which GPU are fastest: attention kernels against each other and against
compilation, the fastest setup and GPU, model FLOPs utilization, where the GPU waited for the
host, energy per token and scaling over GPUs."""

from __future__ import annotations

from itertools import permutations

from stepbench.report.findings.words import (ACROSS_GPUS, NOISE, Finding, best_per_gpu, alike,
                                             attention_pairs, change, compare_rows, compiler,
                                             counted, every, join, span, steady, told, verdict)
from stepbench.report.rows import Row
from stepbench.report.table import sig
from stepbench.units import percent


def attention_speed(rows: list[Row]) -> list[Finding]:
    """Attention kernels against each other in the same mode, per GPU."""
    out = []
    for (mode, compile_mode, a, b), pairs in attention_pairs(rows).items():
        pairs = [(ra, rb) for ra, rb in pairs if told(ra, rb)]
        if not pairs:
            continue
        label = "In eager mode" if mode == "eager" else \
            f"With {compiler(compile_mode)}" if mode == "compile" else f"In {mode} mode"
        verdicts = [verdict(ra, rb) for ra, rb in pairs]
        items = [f"{ra.gpu} {sig(ra.step_ms)} vs {sig(rb.step_ms)} ms ({phrase})"
                 for (ra, rb), (phrase, _) in zip(pairs, verdicts)]
        tags = {NOISE} if any(d == "noise" for _, d in verdicts) else set()
        out.append(Finding("attention_speed",
                           f"{label}, {a} attention against {b} attention: {join(items)}.",
                           frozenset(tags)))
    return out


def attention_vs_compile(rows: list[Row]) -> list[Finding]:
    """Where eager mode with one attention kernel beats the compiled model with another."""
    attns = list(dict.fromkeys(r.attn for r in rows))
    out = []
    for a, b in permutations(attns, 2):
        beat, lost, noise = [], [], []
        for gpu in dict.fromkeys(r.gpu for r in rows):
            eager = next((r for r in rows if r.gpu == gpu and r.mode == "eager"
                          and r.attn == a and r.ok), None)
            comp = min((r for r in rows if r.gpu == gpu and r.mode == "compile"
                        and r.attn == b and r.ok), key=lambda r: r.step_ms, default=None)
            if eager is None or comp is None or not told(eager, comp):
                continue
            _, direction = verdict(eager, comp)
            item = f"{gpu} {sig(eager.step_ms)} vs {sig(comp.step_ms)} ms"
            {"faster": beat, "noise": noise}.get(direction, lost).append((item, eager, comp))
        if not beat:
            continue
        total = len(beat) + len(lost) + len(noise)
        where = (f"on {every(total, 'GPUs')} where both ran" if total > 1 and not (lost or noise)
                 else f"on {len(beat)} of {total} GPUs where both ran" if total > 1 else "")
        text = (f"Eager mode with {a} attention was faster than torch.compile with {b} "
                f"attention {where}".rstrip() + ": " + join([i for i, _, _ in beat]))
        ratios = [e.peak_memory_gb / c.peak_memory_gb for _, e, c in beat
                  if e.peak_memory_gb and c.peak_memory_gb]
        if len(ratios) == len(beat):
            text += f", at {span(ratios, lambda x: f'{x:.2f}')}x the peak memory"
        if lost:
            text += "; not on " + join([i for i, _, _ in lost])
        if noise:
            text += "; within the noise on " + join([i for i, _, _ in noise])
        out.append(Finding("attention_vs_compile", text + ".",
                           frozenset({NOISE} if noise else ())))
    return out


def fastest_setup(rows: list[Row]) -> list[Finding]:
    """Per GPU, the fastest setup against the runner-up on that GPU (the answer to "how should I
    run this step here"), or the two that cannot be told apart."""
    items, tags, untested = [], set(), []
    for gpu in dict.fromkeys(r.gpu for r in rows):
        # A setup whose losses depart from its peers' trains another model: never the answer.
        # A disturbed row is left out (`untested` names it): its step time is not its own.
        ranked = sorted((r for r in rows if r.gpu == gpu and r.ok and not r.departs
                         and steady(r)), key=lambda r: r.step_ms)
        if len(ranked) < 2:
            continue
        top, second = ranked[:2]
        if not told(top, second):
            continue
        _, direction = verdict(second, top)
        untested.append(compare_rows(second, top) is None)
        if direction == "noise":
            tags.add(NOISE)
            items.append((f"{top.name} and {second.name} on {gpu}, {alike(second, top)}", ""))
        else:
            lead = change(top.step_ms, second.step_ms)[0] or "no"
            items.append((f"{top.name} on {gpu} ({top.tokens_per_s:,.0f} {counted(rows)}/s, "
                          f"{sig(top.step_ms)} ms; {lead} faster than the runner-up, "
                          f"{second.name} at {sig(second.step_ms)} ms", ")"))
    if not items:
        return []
    # An untested gap is worded as such: once for the finding when none could be tested.
    if all(untested):
        return [Finding("fastest_setup", "Fastest setup (untested against noise): "
                        + "; ".join(text + end for text, end in items) + ".", frozenset(tags))]
    texts = [text + (", untested against noise" if gap and end else "") + end
             for (text, end), gap in zip(items, untested)]
    return [Finding("fastest_setup", "Fastest setup: " + "; ".join(texts) + ".", frozenset(tags))]


def gpus(rows: list[Row]) -> list[Finding]:
    """Tokens per dollar across GPUs, and the fastest GPU against the runner-up with prices."""
    out, unit = [], counted(rows)
    by_dollar = best_per_gpu(rows, lambda r: r.m_tokens_per_dollar)
    by_speed = best_per_gpu(rows, lambda r: r.tokens_per_s)
    if len(by_dollar) >= 2:
        top, rest = by_dollar[0], by_dollar[1:]
        text = (f"Per dollar, {top.gpu} trained the most {unit}: "
                f"{sig(top.m_tokens_per_dollar, 2)}M {unit} per $ with {top.name}, against "
                + join([f"{sig(r.m_tokens_per_dollar, 2)}M on {r.gpu}" for r in rest]))
        fastest = by_speed[0]
        if fastest.gpu != top.gpu and fastest.price_per_hour:
            text += (f"; it costs {_times(top.price_per_hour / fastest.price_per_hour)} the "
                     f"hourly price of the fastest GPU, {fastest.gpu}")
        out.append(Finding("tokens_per_dollar", text + ".", frozenset({ACROSS_GPUS})))
    elif len(by_dollar) == 1:
        top = by_dollar[0]
        out.append(Finding("tokens_per_dollar", f"On {top.gpu}, {top.name} trained the most "
                           f"{unit} per dollar: {sig(top.m_tokens_per_dollar, 2)}M per $."))
    if len(by_speed) >= 2 and told(*by_speed[:2]):
        top, second = by_speed[:2]
        _, direction = verdict(second, top)
        tags = frozenset({NOISE} if direction == "noise" else ())
        if direction == "noise":
            text = (f"{top.gpu} and {second.gpu} were the fastest GPUs, "
                    f"{alike(second, top)}")
        else:
            text = (f"{top.gpu} was the fastest GPU ({top.tokens_per_s:,.0f} {unit}/s with "
                    f"{top.name}), {_times(top.tokens_per_s / second.tokens_per_s)} "
                    f"{second.gpu} ({second.tokens_per_s:,.0f} {unit}/s with {second.name})")
            if top.price_per_hour and second.price_per_hour:
                text += f" at {_times(top.price_per_hour / second.price_per_hour)} its price"
        out.append(Finding("fastest_gpu", text + ".", tags))
    return out


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1 else f"{ratio:.1f}x"


def mfu(rows: list[Row]) -> list[Finding]:
    """Best model FLOPs utilization per GPU, naming the peak it is measured against."""
    best = best_per_gpu(rows, lambda r: r.mfu)
    if not best:
        return []
    peak = {"measured": "the measured matmul peak", "datasheet": "the datasheet peak"}
    items = [f"{r.mfu * 100:.0f}% on {r.gpu} with {r.name} (against {peak[r.mfu_source]})"
             for r in best]
    return [Finding("mfu", "Best model FLOPs utilization: " + join(items) + ".")]


# A process whose GPU ran kernels less of its step than this waited on the host. On one H200,
# profiled plain steps of the post's model ran 94-96% of their step (compiled whole or per
# layer, eager+sdpa in its fast processes), host-bound ones 38-79% (FSDP2 at world size 1,
# eager+sdpa's slow processes; benchmarks/README.md sections e and h).
HOST_BOUND = 0.85


def host_bound(rows: list[Row]) -> list[Finding]:
    """The setups whose GPU waited for the host (`run --profile`'s kernel time against the
    median step), in some process or in all, per GPU."""
    waited = [r for r in rows if r.gpu_busy_low is not None and r.gpu_busy_low < HOST_BOUND
              and steady(r)]
    marked = [r for r in rows if r.ok and "host_bound" in r.noise_flags and steady(r)
              and r.gpu_busy_low is None]
    out = [_host_lead(marked)] if marked else []
    if not waited:
        return out
    per_gpu: dict[str, list[str]] = {}
    for r in sorted(waited, key=lambda r: r.gpu_busy_low):
        name = r.name + (f" ({r.setup.parallel_label})" if r.setup.distributed else "")
        share = f"{r.gpu_busy * 100:.0f}%"
        if r.gpu_busy >= HOST_BOUND:
            share += f" ({r.gpu_busy_low * 100:.0f}% in its slowest process)"
        per_gpu.setdefault(r.gpu, []).append(f"{name} {share}")
    where = "; ".join(f"on {gpu}, {join(items)}" for gpu, items in per_gpu.items())
    return [Finding("host_bound", "The GPU waited for the host (the share of the median step "
                    f"its kernels took, profiled): {where}. There the host's Python, dispatch, "
                    "kernel launches and hooks set the pace; fewer, larger kernels and launches "
                    "(torch.compile, CUDA graphs, fewer FSDP2 units) shorten it.")] + out


def _host_lead(rows: list[Row]) -> Finding:
    """The rows the cheap mark (the record's host lead, stepbench.hostlead) calls host-bound,
    where no profile says more."""
    per_gpu: dict[str, list[str]] = {}
    for r in rows:
        per_gpu.setdefault(r.gpu, []).append(f"{r.name} ({sig(r.step_ms)} ms)")
    where = "; ".join(f"on {gpu}, {join(items)}" for gpu, items in per_gpu.items())
    return Finding("host_bound", "The GPU finished each step right after the host launched its "
                   f"last kernel (^, the host's lead under 5% of the step): {where}. Their step "
                   "time is the host's CPU speed as much as the GPU's: a faster or quieter host "
                   "may measure them faster; `run --profile` shows where the GPU waited.")


def energy(rows: list[Row]) -> list[Finding]:
    """Most tokens (the workload's unit) per kWh per GPU."""
    best = best_per_gpu(rows, lambda r: r.tokens_per_kwh)
    if not best:
        return []
    items = [f"{sig(r.tokens_per_kwh / 1e6, 2)}M on {r.gpu} with {r.name}" for r in best]
    return [Finding("energy", f"Most {counted(rows)} per kWh of GPU energy: " + join(items)
                    + ".")]


def scaling(rows: list[Row]) -> list[Finding]:
    """A distributed job against one GPU without a wrapper: tokens/s, efficiency, memory per GPU;
    a job of one process, the wrapper's own cost (no communication, nothing to scale)."""
    items, unit = [], counted(rows)
    # One workload's rows: one parallel style and size (its label is part of the workload).
    alone = rows[0].setup.world_size == 1
    for row in rows:
        if row.scaling_efficiency is None or not steady(row):
            continue
        speedup = row.scaling_efficiency * row.setup.world_size
        memory = ("" if row.peak_memory_gb is None else
                  f", peak memory {row.peak_memory_gb:.1f} GB per GPU")
        if alone:
            bound = " (host-bound, ^: the wrapper's hooks set the pace)" if \
                "host_bound" in row.noise_flags else ""
            items.append(f"{row.name} on {row.gpu}: {speedup:.2f}x the {unit}/s of the same "
                         f"process unwrapped{bound}{memory}")
            continue
        items.append(f"{row.name} on {row.gpu}: {speedup:.2f}x the {unit}/s of one GPU "
                     f"({percent(row.scaling_efficiency)} scaling efficiency, "
                     f"{row.tokens_per_s_per_gpu:,.0f} {unit}/s per GPU){memory}")
    if not items:
        return []
    label = rows[0].setup.parallel_label
    if alone:
        return [Finding("scaling", f"The {rows[0].setup.parallel} wrapper's own cost on one "
                        f"process ({label}, no communication): " + "; ".join(items) + ".")]
    return [Finding("scaling", f"Scaling over {label}: " + "; ".join(items) + ".")]
