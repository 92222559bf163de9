"""A row of the report: every record of one setup on one GPU, combined.

Records arrive one per process (`repeat`), possibly from several runs; the report shows one row
per GPU x setup, so repeats are combined here (median of per-process means, bootstrap CI, max
of peaks, median of the per-process details such as MFU and energy), prices (hourly and, when
given, of electricity) are joined, and each row carries the loss guard's verdict (stepbench.guard:
a compiled row against its eager twin where that ran).
Rows are ordered as the original experiment's table: per GPU, per attention in order of
appearance, eager first. The per-process details (first step and compile, MFU, energy) are
combined by report/details.py.

A row is one Setup identity (`Setup.key()`) on one GPU: records that differ in any setting are
never combined, and a compiled row's eager twin is the row of `Setup.eager_twin()`. Records run
through SSH hosts (`run --host`) also keep their host apart: where one GPU ran on several hosts,
each host has its own rows and the row's `gpu` (the machine every table shows) names the host.
"""

from __future__ import annotations

import functools
import statistics
from collections import Counter
from dataclasses import dataclass, field

from stepbench.axes import AXES
from stepbench.guard import Verdict, loss_verdicts
from stepbench.noise import peaks_disagree, processes_disagree
from stepbench.record import Record
from stepbench import stats
from stepbench.report.details import combine_details, combine_energy, combine_first_step, median
from stepbench.report.meta import row_fields
from stepbench.report.prices import price_for
from stepbench.setup import Setup
from stepbench.units import unit_of

@dataclass
class Row:
    """One GPU x setup: the records of all its repeats combined. Units are in the names."""

    gpu: str                     # the machine: the GPU's name, with the host where that tells apart
    setup: Setup                 # what ran: every record of the row has this Setup
    status: str
    statuses: dict[str, int]
    repeats: int
    runs: int
    price_per_hour: float | None = None
    # Where price_per_hour came from: "given" (--price, --prices) or the provider that rented the
    # machine ("runcrate": its hourly price, per GPU); None: no price.
    price_source: str | None = None
    step_ms: float | None = None
    step_ms_ci: tuple[float, float] | None = None
    ci_method: str | None = None
    tokens_per_s: float | None = None
    peak_memory_gb: float | None = None
    first_step_s: float | None = None
    first_step_warm_s: float | None = None
    m_tokens_per_dollar: float | None = None
    noise_flags: list[str] = field(default_factory=list)
    error: str | None = None
    gpu_memory_gb: float | None = None
    # MFU of the preferred peak (measured, else datasheet), kept for findings and old readers.
    mfu: float | None = None
    mfu_source: str | None = None
    achieved_tflops: float | None = None
    mfu_measured: float | None = None
    mfu_datasheet: float | None = None
    peak_tflops_measured: float | None = None
    peak_tflops_datasheet: float | None = None
    flops_per_token: float | None = None
    flops_per_token_causal: float | None = None
    flops_convention: str | None = None
    # FlopCounterMode's count per step over the convention's (flops_per_token x batch x seq),
    # minus 1: +0.031 = the counter counted 3.1% more.
    flop_counter_diff: float | None = None
    # `run --profile` on a GPU: the profiled step's kernel time over the process's median timed
    # step, a fraction (below 1 where the GPU waited for the host); the median over the row's
    # processes, and the lowest.
    gpu_busy: float | None = None
    gpu_busy_low: float | None = None
    compile_cache: str | None = None
    # Under a cache shared by every process ("shared": run --compile-cache, tune), what inductor's
    # cache counters say it was for this row's processes: "cold" (no hits), "warm" (only hits),
    # None (mixed, or not a shared cache).
    shared_cache: str | None = None
    # What first_step_s measured (compile_start): "cold" compiles, compiles from a "shared"
    # cache (neither said cold nor all warm), only "warm" ones, or None (no cache details).
    first_step_cache: str | None = None
    # Some of first_step_warm_s's processes were warm from a cache shared with other setups.
    warm_from_shared: bool = False
    # torch.compile: most graph breaks and recompilations (after the first step) of any process.
    graph_breaks: int | None = None
    recompiles: int | None = None
    recompile_limit_hits: int | None = None
    # Per-layer compile measured before every decoder layer had its graph: the layers past
    # dynamo's recompile limit ran eagerly (Record.compiled_too_few_layers).
    before_layer_fix: bool = False
    break_reasons: list[str] = field(default_factory=list)
    tokens_per_kwh: float | None = None
    joules_per_token: float | None = None
    # Cost of a million tokens: GPU time at the hourly price, and the GPU's electricity alone.
    dollars_per_m_tokens: float | None = None
    energy_price_per_kwh: float | None = None
    energy_cost_per_m_tokens: float | None = None
    loss_last: float | None = None
    # A distributed job (ddp, fsdp2): tokens/s per GPU (of its slowest rank), the relative spread
    # of its ranks' mean step times, and scaling efficiency against one GPU without a wrapper.
    tokens_per_s_per_gpu: float | None = None
    rank_spread: float | None = None
    scaling_efficiency: float | None = None
    scaling_baseline: str | None = None
    # The loss guard (stepbench.guard): ok, departs, reference or unchecked; None: did not run.
    loss_guard: Verdict | None = None
    # Samples for significance tests (not shown): per-process step_ms, each process's step
    # times, and all step times pooled.
    repeat_step_ms: list[float] = field(default_factory=list, repr=False)
    process_step_times_ms: list[list[float]] = field(default_factory=list, repr=False)
    step_times_ms: list[float] = field(default_factory=list, repr=False)
    records: list[Record] = field(default_factory=list, repr=False)
    # compare()'s results by (other row's id, per token): (other row, comparison).
    _compared: dict = field(default_factory=dict, repr=False, compare=False)
    gpu_name: str = ""           # the GPU's name as the driver gives it (prices are keyed by it)
    host: str | None = None      # the SSH host the records ran on (`run --host`), None for local
    label: str | None = None     # the label of the input its records came from (`--label`)

    def __post_init__(self):
        self.gpu_name = self.gpu_name or self.gpu

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.step_ms is not None

    @property
    def compile_marked(self) -> bool:
        """torch.compile did more than one graph compiled once: graph breaks, recompilations
        after the first step, or code left eager at the recompile limit."""
        return bool(self.graph_breaks or self.recompiles or self.recompile_limit_hits
                    or self.before_layer_fix)

    @property
    def key(self) -> tuple[str, str]:
        return self.setup.key(), self.gpu

    @functools.cached_property
    def eager_twin_key(self) -> tuple[str, str]:
        """The key of its eager twin's row (Setup.eager_twin) on the same GPU."""
        return self.setup.eager_twin().key(), self.gpu

    @functools.cached_property
    def label_parts(self) -> tuple[str, ...]:
        """The setup's LABEL_PARTS, in their order: what `setup_labels` may add to its name
        (made once: every table of a report labels every row)."""
        return tuple(part(self.setup) for part in LABEL_PARTS.values())

    @functools.cached_property
    def workload(self) -> Setup:
        """What the row trains; rows of one workload are compared with each other."""
        return self.setup.workload()

    # The setup's fields, read often enough by findings and tables to be named here.
    name = property(lambda self: self.setup.name)
    mode = property(lambda self: self.setup.mode)
    attn = property(lambda self: self.setup.attn)
    compile_mode = property(lambda self: self.setup.compile_mode)
    batch = property(lambda self: self.setup.batch)
    seq = property(lambda self: self.setup.seq)
    dtype = property(lambda self: self.setup.dtype)
    model = property(lambda self: self.setup.model_label)
    parallel = property(lambda self: self.setup.parallel)

    @property
    def gpus(self) -> int:
        """GPUs one job of the row holds (what its cost per token pays for)."""
        return self.setup.world_size if self.setup.device == "cuda" else 1

    def as_dict(self) -> dict:
        """The JSON row: the results contract's columns first, then everything else measured."""
        return {
            "gpu": self.gpu, "gpu_name": self.gpu_name, "host": self.host, "label": self.label,
            "price_per_hour": self.price_per_hour, "price_source": self.price_source,
            "setup": self.name,
            "status": self.status, "step_ms": self.step_ms, "tokens_per_s": self.tokens_per_s,
            "peak_memory_gb": self.peak_memory_gb, "first_step_s": self.first_step_s,
            "m_tokens_per_dollar": self.m_tokens_per_dollar,
            # What tokens_per_s counts: a user's workload's unit, tokens for a transformers model.
            "units": unit_of(*(r.units for r in self.records)),
            "mode": self.mode, "attn": self.attn, "compile_mode": self.compile_mode,
            "model": self.setup.model, "model_label": self.model,
            # A factory's own parameters: rows that differ only there share a name.
            "params": self.setup.params, "batch": self.batch,
            "seq": self.seq, "dtype": self.dtype, "device": self.setup.device,
            "warmup": self.setup.warmup, "steps": self.setup.steps, "seed": self.setup.seed,
            "memory_limit_gb": self.setup.memory_limit_gb,
            "repeats": self.repeats, "runs": self.runs, "statuses": self.statuses,
            "step_ms_ci": list(self.step_ms_ci) if self.step_ms_ci else None,
            "step_ms_ci_method": self.ci_method, "noise_flags": self.noise_flags,
            "error": self.error, "gpu_memory_gb": self.gpu_memory_gb,
            "first_step_warm_s": self.first_step_warm_s, "compile_cache": self.compile_cache,
            "first_step_cache": self.first_step_cache,
            "graph_breaks": self.graph_breaks, "recompiles": self.recompiles,
            "recompile_limit_hits": self.recompile_limit_hits,
            "gpu_busy": self.gpu_busy, "gpu_busy_low": self.gpu_busy_low,
            "before_layer_fix": self.before_layer_fix,
            "break_reasons": self.break_reasons,
            "mfu": self.mfu, "mfu_source": self.mfu_source,
            "achieved_tflops": self.achieved_tflops, "mfu_measured": self.mfu_measured,
            "mfu_datasheet": self.mfu_datasheet,
            "peak_tflops_measured": self.peak_tflops_measured,
            "peak_tflops_datasheet": self.peak_tflops_datasheet,
            "flops_per_token": self.flops_per_token,
            "flops_per_token_causal": self.flops_per_token_causal,
            "flops_convention": self.flops_convention,
            "flop_counter_diff": self.flop_counter_diff,
            "tokens_per_kwh": self.tokens_per_kwh, "joules_per_token": self.joules_per_token,
            "dollars_per_m_tokens": self.dollars_per_m_tokens,
            "energy_price_per_kwh": self.energy_price_per_kwh,
            "energy_cost_per_m_tokens": self.energy_cost_per_m_tokens,
            "loss_last": self.loss_last,
            **row_fields(self.records),
            "parallel": self.parallel, "nproc": self.setup.nproc, "nnodes": self.setup.nnodes,
            "gpus": self.gpus, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "rank_spread": self.rank_spread, "scaling_efficiency": self.scaling_efficiency,
            "scaling_baseline": self.scaling_baseline,
            **self.loss_guard_fields(),
        }

    def csv_dict(self) -> dict:
        """as_dict, with the interval as two columns (step_ms_ci_low, step_ms_ci_high)."""
        d = self.as_dict()
        d["step_ms_ci_low"], d["step_ms_ci_high"] = self.step_ms_ci or (None, None)
        return d

    def loss_guard_fields(self) -> dict:
        guard = self.loss_guard
        return {"loss_guard": guard.status if guard else None,
                "loss_guard_reference": guard.reference if guard else None,
                "loss_guard_rel_diff": guard.max_rel_diff if guard else None,
                "loss_guard_first_rel_diff": guard.first_rel_diff if guard else None,
                "loss_guard_tolerance": guard.tolerance if guard else None}

    def row_label(self) -> str:
        """"compile+sdpa (batch 16 x 2048, float8) on NVIDIA H200": enough to find the row."""
        c = self.setup
        return f"{self.name} (batch {c.shape}, {c.dtype}) on {self.gpu}"

    def compare(self, other: "Row", per_token: bool = False) -> stats.Comparison | None:
        """This row's step times against `other`'s (stats.compare_step_times: their processes
        where both ran two or more, else the pooled per-step times), per token with
        `per_token` (rows of different batches); None when nothing can be tested. Kept, since
        several findings test the same pair and a bootstrap is the report's costliest step."""
        key = (id(other), per_token)
        kept = self._compared.get(key)
        if kept is None or kept[0] is not other:
            tokens = ((self.setup.tokens_per_step, other.setup.tokens_per_step) if per_token
                      else (1, 1))
            kept = (other, stats.compare_step_times(
                self.repeat_step_ms, other.repeat_step_ms, self.process_step_times_ms,
                other.process_step_times_ms, a_tokens=tokens[0], b_tokens=tokens[1]))
            self._compared[key] = kept
        return kept[1]

    def test_method(self, other: "Row") -> str | None:
        """How this row and `other` are tested against each other (Comparison.method), None
        when they cannot be: the same either way round, so a comparison kept in the other
        direction answers it without another bootstrap."""
        kept = other._compared.get((id(self), False))
        if kept is not None and kept[0] is self:
            return kept[1] and kept[1].method
        result = self.compare(other)
        return result and result.method

    @property
    def departs(self) -> bool:
        """The loss guard flagged it: its losses leave its reference's tolerance."""
        return self.loss_guard is not None and self.loss_guard.departs


def build_rows(records: list[Record], prices: dict[str, float],
               energy_price: float | None = None, *,
               labels: dict[int, str] | None = None, identity=None) -> list[Row]:
    """Group records by setup identity x GPU, combine each group, order the rows (per GPU, per
    attention, eager first).

    `energy_price` is dollars per kWh of electricity (None: no energy cost). `labels`: {id of
    a record: the label of its input} (`report --label`): records of differently labelled
    inputs are never combined, and their rows name the label with the GPU. `identity`: a
    record's setup identity (default Setup.key; `compare` matches by Setup.match_key)."""
    labels = labels or {}
    identity = identity or (lambda setup: setup.key())
    machine = machine_labels(records, labels)
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        groups.setdefault((identity(record.setup), record.machine.name, record.host,
                           labels.get(id(record))), []).append(record)
    rows = []
    for group in groups.values():
        price, source = row_price(prices, group)
        rows.append(combine(group, price, energy_price, gpu=machine(group[0]), interval=False))
        rows[-1].price_source = source
        rows[-1].label = labels.get(id(group[0]))
    add_intervals(rows)
    rows.sort(key=_order(records, machine))
    add_scaling(rows)
    if not labels:
        verdicts = loss_verdicts(records)
        for row in rows:    # the guard keys a machine by its driver's name, as records do
            row.loss_guard = verdicts.get((row.setup.key(), row.gpu_name))
        return rows
    for label in dict.fromkeys(labels.get(id(r)) for r in records):
        # The loss guard within each input: a labelled input is another run to compare.
        verdicts = loss_verdicts([r for r in records if labels.get(id(r)) == label])
        for row in rows:
            if row.label == label:
                row.loss_guard = verdicts.get((row.setup.key(), row.gpu_name))
    return rows


def row_price(prices: dict[str, float], records: list[Record]) -> tuple[float | None, str | None]:
    """A GPU's price per hour and where it came from: a price given to the report (by the GPU's
    name as the driver reports it) wins; else the provider's price of the machine the records
    were rented on (`run --rent`), per GPU; else none."""
    given = price_for(prices, records[0].machine.gpu)
    if given is not None:
        return given, "given"
    rented = [r.rental for r in records
              if isinstance(r.rental, dict) and (r.rental.get("price_per_hour") or 0) > 0]
    if not rented:
        return None, None
    last = rented[-1]      # a later rental of the same machine (a resumed study) has today's price
    gpus = last.get("gpu_count") if isinstance(last.get("gpu_count"), int) else 1
    return last["price_per_hour"] / max(1, gpus), str(last.get("provider") or "provider")


def machine_labels(records: list[Record], labels: dict[int, str] | None = None):
    """record -> the machine its row names: the GPU's name, plus the host ("NVIDIA H100 PCIe
    (gpu-a)") where that GPU ran on more than one host, and the label of the record's input
    where given ("NVIDIA H200 (main)"). A record run here has no host: it is named by its
    hostname. A CPU is named by its model and cores (Machine.name), its parts in one pair of
    parentheses: "CPU (AMD EPYC, 2 cores, gpu-a)"."""
    labels = labels or {}
    hosts: dict[str, set] = {}
    for r in records:
        hosts.setdefault(r.machine.name, set()).add(r.host)

    def label(r: Record) -> str:
        name = r.machine.name
        parts = [r.host or r.machine.hostname or "local"] if len(hosts[name]) > 1 else []
        parts += [labels[id(r)]] if labels.get(id(r)) is not None else []
        return r.machine.named(*parts)

    return label


def _order(records: list[Record], machine):
    """Per machine, per workload, per attention in order of appearance; eager before compile."""
    first: dict[tuple, int] = {}
    workloads: dict[Setup, Setup] = {}
    for i, r in enumerate(records):
        if r.setup not in workloads:
            workloads[r.setup] = r.setup.workload()
        for key in (("gpu", machine(r)), ("work", workloads[r.setup]), ("attn", r.setup.attn),
                    ("name", r.setup.name)):
            first.setdefault(key, i)
    return lambda row: (first[("gpu", row.gpu)], first[("work", row.workload)],
                        first[("attn", row.attn)], row.mode != "eager", first[("name", row.name)])


def combine(records: list[Record], price: float | None, energy_price: float | None = None,
            gpu: str | None = None, interval: bool = True) -> Row:
    """One row from the records of one setup on one GPU (one per repeat, from any runs);
    `gpu` is the machine the row names (default: the GPU's name); with `interval` False its
    step time's interval is left to `add_intervals`.

    Step time: the median of the per-process means; with one process, its mean. Its 95% CI is
    a bootstrap over the per-process means, or over the step times when one process ran.
    Noise flags: every process's own, process_spread where its processes disagree
    (noise.processes_disagree, the rule by which `run` measured a third), and memory_spread
    where their peaks do (noise.peaks_disagree).
    Peak memory: the largest peak of any process. First step: median over processes, with a
    warm compile cache counted apart (first_step_warm_s). Details (TFLOP/s, MFU, FLOP counter,
    energy): the median over processes.
    """
    head = records[0]
    statuses = Counter(r.status for r in records)
    ok = [r for r in records if r.ok]
    failed = [r for r in records if r.status != "ok"]
    row = Row(
        gpu=gpu or head.machine.name, gpu_name=head.machine.gpu, host=head.host, setup=head.setup,
        status="ok" if ok else statuses.most_common(1)[0][0], statuses=dict(statuses),
        repeats=len(records), runs=len({r.run_id for r in records}),
        price_per_hour=price, gpu_memory_gb=head.machine.gpu_memory_gb,
        error=next((r.error for r in failed if r.error), None), records=records)
    if not ok:
        return row
    row.repeat_step_ms = [r.step_ms for r in ok]
    row.process_step_times_ms = [list(r.step_times_ms) for r in ok]
    row.step_times_ms = [t for r in ok for t in r.step_times_ms]
    row.step_ms = statistics.median(row.repeat_step_ms)
    if interval:
        add_intervals([row])
    # A user's workload counts its own units (record.units_per_step, per process).
    per_step = (ok[0].units_per_step * row.setup.world_size if ok[0].units_per_step
                else row.setup.tokens_per_step)
    row.tokens_per_s = per_step * 1000.0 / row.step_ms
    if row.tokens_per_s and price:
        # A job pays for every GPU it holds: the price is per GPU, the tokens the job's.
        job_price = price * row.gpus
        row.m_tokens_per_dollar = row.tokens_per_s * 3600 / job_price / 1e6
        row.dollars_per_m_tokens = job_price / (row.tokens_per_s * 3600 / 1e6)
    peaks = [r.peak_memory_gb for r in ok if r.peak_memory_gb is not None]
    row.peak_memory_gb = max(peaks) if peaks else None
    combine_first_step(row, ok)
    flags = [f for r in ok for f in r.noise_flags]       # each process's own (high_cv: its steps)
    if processes_disagree(ok):
        flags.append("process_spread")
    if peaks_disagree(ok):
        flags.append("memory_spread")
    row.noise_flags = list(dict.fromkeys(flags))
    combine_details(row, ok)
    combine_energy(row, ok, energy_price)
    return row


def add_intervals(rows: list[Row]) -> None:
    """Each row's 95% interval of its step time (`combine`'s), all rows' at once (the
    bootstrap of rows of one size shares its work: stats.bootstrap_cis)."""
    ran = [row for row in rows if row.ok]
    medians = [row for row in ran if len(row.repeat_step_ms) >= 2]
    means = [row for row in ran if len(row.repeat_step_ms) < 2 and len(row.step_times_ms) >= 2]
    for row, ci in zip(medians, stats.median_cis([row.repeat_step_ms for row in medians])):
        row.step_ms_ci = ci
        row.ci_method = (f"median of {len(row.repeat_step_ms)} per-process means, bootstrap "
                         "over processes")
    for row, ci in zip(means, stats.mean_cis([row.step_times_ms for row in means])):
        row.step_ms_ci = ci
        row.ci_method = f"mean of {len(row.step_times_ms)} steps, bootstrap over steps"


def add_scaling(rows: list[Row]) -> None:
    """Tokens/s per GPU and scaling efficiency of each distributed row: its tokens/s per GPU over
    the tokens/s of the same setup on one GPU without a wrapper (the row of
    `Setup.single_process_twin()` on the same GPU, in this report), else the efficiency its
    records were given at run time against a baseline in their own results file."""
    by_key = {row.key: row for row in rows}
    for row in rows:
        if not row.ok or not row.setup.distributed:
            continue
        row.tokens_per_s_per_gpu = row.tokens_per_s / row.setup.world_size
        spreads = [(r.scaling or {}).get("rank_step_ms_spread") for r in row.records if r.ok]
        row.rank_spread = median(spreads)
        twin = by_key.get((row.setup.single_process_twin().key(), row.gpu))
        if twin is not None and twin.ok:
            row.scaling_efficiency = row.tokens_per_s_per_gpu / twin.tokens_per_s
            dtype = f" ({twin.setup.dtype})" if twin.setup.dtype != row.setup.dtype else ""
            row.scaling_baseline = (f"{twin.name}{dtype}, 1 process ({twin.repeats} run"
                                    f"{'s' if twin.repeats > 1 else ''} in this report)")
            continue
        recorded = [r.scaling for r in row.records if r.ok and isinstance(r.scaling, dict)
                    and r.scaling.get("efficiency") is not None]
        if recorded:
            row.scaling_efficiency = median(s["efficiency"] for s in recorded)
            base = recorded[-1].get("baseline") or {}
            row.scaling_baseline = (f"{row.name}, 1 process, as recorded at run time (run "
                                    f"{base.get('run_id', '?')})")


def eager_twins(rows: list[Row], both_ok: bool = True) -> list[tuple[Row, Row]]:
    """(compiled row, its eager twin's row on the same GPU), in row order, for every compiled
    row whose twin is there (and, with `both_ok`, both ran)."""
    by_key = {row.key: row for row in rows}
    pairs = []
    for row in rows:
        twin = by_key.get(row.eager_twin_key) if row.mode == "compile" else None
        if row.mode == "compile" and twin is not None and (not both_ok or (row.ok and twin.ok)):
            pairs.append((row, twin))
    return pairs


# Parts of a row's label beyond the setup name, shown where rows differ in them: the registry's
# `detail` of each axis (axes.AXES): "llama-tiny", "4x2048" (batch), "bf16", "4+20 steps" ...
LABEL_PARTS = {a.name: a.detail for a in AXES if a.detail is not None}


def setup_labels(rows: list[Row], shown: list[str] = ()) -> dict[int, str]:
    """Setup name, plus what tells rows apart where they differ beyond it (model, batch x seq,
    dtype, steps, seed, memory limit); batch x seq is left out when the table `shown` them."""
    if not rows:
        return {}
    values = list(zip(*(r.label_parts for r in rows)))       # per part, every row's
    varying = [i for i, name in enumerate(LABEL_PARTS)
               if not (name == "batch" and shown) and len(set(values[i])) > 1]
    return {id(r): r.name + (f" ({', '.join(r.label_parts[i] for i in varying)})" if varying
                             else "") for r in rows}


def status_text(status: str) -> str:
    return "OOM" if status == "oom" else status
