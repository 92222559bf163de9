"""Predictions for every setup of the results files on every target GPU, as a report Document
(every format the report has). A prediction is never shown as a measurement: the title, the
columns and the JSON rows (`predicted: true`) say so, and the notes say what it scales from."""

from __future__ import annotations

from stepbench.errors import UserError
from stepbench.predict import gpus, memory, model
from stepbench.predict.source import Measured, measured, require_profiles
from stepbench.report.layout import Document, Table
from stepbench.report.prices import load_price_file, price_for

COLUMNS = ["GPU", "Setup", "Predicted step (ms)", "Interval (ms)", "Predicted tokens/s",
           "Fits (need / has GB)", "$/hour", "Predicted M tokens/$"]
POST_TORCH = "2.8"


def predictions(steps: list[Measured], targets: list[gpus.Gpu], prices: dict[str, float]
                ) -> list[model.Prediction]:
    """Each setup on each target, in target order then setup order."""
    out = []
    for target in targets:
        for step in steps:
            src = gpus.lookup(step.gpu)
            out.append(model.predict(step, src, target, price_for(prices, target.name)))
    return out


def build(paths: list[str], gpu_names: list[str], price_list: str | None = None,
          traces: list[str] | None = None, warn=lambda text: None, *,
          prices: dict[str, float] | None = None, keep=None,
          price_flag: str = "--price-list FILE (TOML [prices] or CSV gpu,price_per_hour)"
          ) -> Document:
    """The predictions' Document. `prices` (a report's, already read) instead of `price_list`;
    `keep` filters each file's records (source.measured); `price_flag`: how the note about a
    missing price names the flag to add."""
    targets = [gpus.lookup(name) for name in gpu_names]
    if prices is None:
        prices = load_price_file(price_list) if price_list else {}
    found = measured(paths, traces, warn, keep)
    steps = require_profiles(found, paths)
    unknown = sorted({s.gpu for s in steps if gpus.find(s.gpu) is None})
    if unknown:
        raise UserError(f"the source GPU {', '.join(unknown)} is not in the GPU table "
                        "(stepbench/predict/gpus.toml); add it with its vendor figures")
    rows = predictions(steps, targets, prices)
    return document(rows, steps, [m for m in found if not m.classes_ms], bool(prices),
                    price_flag)


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def cells(p: model.Prediction) -> list[str]:
    if p.no_basis:
        return [p.gpu, p.setup, "no basis", "", "", _fit(p), _price(p), ""]
    tps = p.tokens_per_s
    tpd = p.tokens_per_dollar
    return [p.gpu, p.setup, _ms(p.step_ms) if p.fits else f"({_ms(p.step_ms)})",
            f"{_ms(p.step_ms_low)}-{_ms(p.step_ms_high)}",
            "" if tps is None else f"{tps:,.0f}", _fit(p), _price(p),
            "" if tpd is None else f"{tpd / 1e6:.1f}"]


def _fit(p: model.Prediction) -> str:
    if p.fits is None:
        return "unknown"
    word = "yes" if p.fits else "OOM"
    return f"{word} ({p.memory_needed_gb:.1f} / {p.memory_usable_gb:.1f})"


def _price(p: model.Prediction) -> str:
    return "" if p.price_per_hour is None else f"{p.price_per_hour:.2f}"


def notes(rows: list[model.Prediction], steps: list[Measured], failed: list[Measured],
          priced: bool, price_flag: str) -> list[str]:
    sources = sorted({(s.gpu, s.torch or "unknown") for s in steps})
    out = ["Predicted, not measured: each kernel class of the source's profiled step scaled "
           "by the figure that bounds it on the target (tensor peak, memory bandwidth, "
           "interconnect; docs/predict.md), the host's time kept; the interval from a stated "
           "uncertainty per class.",
           "Scaled from " + "; ".join(f"{gpu} (torch {torch})" for gpu, torch in sources)
           + f". Software on the target may differ (the published four-GPU table used torch "
           f"{POST_TORCH}): kernels, attention backends and compiled code change with versions.",
           f"Fits: the step's peak reserved memory plus {model.CONTEXT_GB:.0f} GB for the CUDA "
           "context against the GPU's memory; a step shown in parentheses does not fit."]
    for gpu in dict.fromkeys(p.gpu for p in rows):
        note = gpus.table()[gpu].notes
        if note:
            out.append(f"{gpu}: {' '.join(note.split())}.")
    out += rate_notes(rows)
    if any(p.l2_model and p.step_ms is not None for p in rows):
        out.append("Memory-bound kernels (elementwise, reductions) went through the L2 model "
                   f"(predict/calibration.toml): {memory.constants()['source']}.")
    compiled = sorted({s.torch or "unknown" for s in steps if s.mode == "compile"})
    if compiled:
        out.append("Compiled setups scale the source's compiled kernels (torch "
                   + ", ".join(compiled) + "): what compile gains is a property of the torch "
                   "version and the GPU's architecture that the prediction cannot know; where "
                   "another version compiles a slower step (the published H100 PCIe "
                   f"compile+sdpa, torch {POST_TORCH}, was slower than its eager+sdpa), the "
                   "prediction is too fast.")
    for reason in sorted({p.no_basis for p in rows if p.no_basis}):
        out.append(f"Not predicted: {reason}.")
    unpriced = sorted({p.gpu for p in rows if p.price_per_hour is None})
    if unpriced:
        how = "" if priced else f"; pass {price_flag}"
        out.append(f"No price for {', '.join(unpriced)}: tokens per dollar left out{how}.")
    for m in failed:
        out.append(f"{m.setup} on {m.gpu}: {m.status}, nothing to scale"
                   + (" (no profile of its kernels)" if m.status == "ok" else "") + ".")
    return out


def rate_notes(rows: list[model.Prediction]) -> list[str]:
    """One line per target whose tensor classes scaled by measured matmul rates."""
    out = []
    for gpu in dict.fromkeys(p.gpu for p in rows):
        used = {(p.source.gpu, rates) for p in rows if p.gpu == gpu and p.step_ms is not None
                and (rates := model.measured_rates(p.source, gpus.table()[gpu]))}
        cited = gpus.table()[gpu].measured_sources.get("bf16_matmul_tflops", "")
        for source, (src, tgt) in sorted(used):
            out.append(f"{gpu}: matmul and attention scaled by measured bf16 matmul rates, "
                       f"{src:.1f} TFLOP/s on {source} (measured in its run) over {tgt:.1f} "
                       f"published ({cited.split(': ')[0]}), not by datasheet peaks.")
    return out


def document(rows: list[model.Prediction], steps: list[Measured], failed: list[Measured],
             priced: bool, price_flag: str) -> Document:
    models = sorted({f"{s.model}, batch {s.batch} x {s.seq}, {s.dtype}" for s in steps})
    table = Table(columns=COLUMNS, cells=[cells(p) for p in rows], align="llrrrlrr",
                  title="Predicted (not measured) step time, fit and tokens per dollar",
                  notes=notes(rows, steps, failed, priced, price_flag))
    header = [("Predicted from", "; ".join(models) + f" ({len(steps)} setups measured with "
               "their kernels profiled)")]
    return Document(title=table.title, tables=[table], rows=rows, header=header,
                    csv_keys=model.CSV_KEYS,
                    extra={"predicted": True, "sources": [
                        {"gpu": s.gpu, "torch": s.torch, "setup": s.setup,
                         "step_ms": s.step_ms, "classes_ms": s.classes_ms,
                         "idle_ms": s.idle_ms} for s in steps]})


# The CSV columns of `report --predict`'s rows, after the report's: the report's own columns
# (step_ms, tokens_per_s, ...) are measurements, so a prediction has columns of its own.
REPORT_CSV = {"gpu": "gpu", "setup": "setup", "predicted": "predicted",
              "step_ms": "predicted_step_ms", "step_ms_low": "predicted_step_ms_low",
              "step_ms_high": "predicted_step_ms_high", "fits": "predicted_fits",
              "tokens_per_s": "predicted_tokens_per_s",
              "tokens_per_dollar": "predicted_tokens_per_dollar",
              "memory_needed_gb": "predicted_memory_needed_gb", "no_basis": "no_basis",
              "source_gpu": "source_gpu", "source_step_ms": "source_step_ms"}


def report_csv(rows: list[model.Prediction]) -> tuple[list[str], list[dict]]:
    """The predictions as the report's CSV adds them (Document.csv_more)."""
    dicts = [{REPORT_CSV[k]: v for k, v in p.csv_dict().items() if k in REPORT_CSV}
             for p in rows]
    return list(REPORT_CSV.values()), dicts
