"""Predict the published four-GPU table (RTX 5090, L40S, RTX A6000, H100 PCIe x the four
setups of llama-468m at batch 4 x 2048, bf16) from the committed H200 run measured with
--profile, and compare each row with the published one (tests/data/post/).

The prediction reads only the H200 records, their traces, the GPU table and the price list
(benchmarks/prices.toml); the published rows are read afterwards, for the comparison alone
(tests/test_predict_post.py checks that predicting opens nothing under tests/data/post/).

    PYTHONPATH=src python benchmarks/predict_post.py [--json] [--results H200.jsonl]

--results predicts from another H200 results file of the four setups (its traces in the folder
beside it, STEM-traces), e.g. one just measured by benchmarks/gpu_predict_shapes.sh.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from stepbench.predict import gpus
from stepbench.predict.document import predictions
from stepbench.predict.source import measured, require_profiles
from stepbench.report.prices import load_price_file, price_for

HERE = Path(__file__).resolve().parent
H200 = HERE / "results" / "h200-2026-12-04-profile-matrix.jsonl"
PRICES = HERE / "prices.toml"
POST = HERE.parent / "tests" / "data" / "post"
TARGETS = ["RTX 5090", "L40S", "RTX A6000", "H100 PCIe"]
SETUPS = ["eager+sdpa", "compile+sdpa", "eager+eager", "compile+eager"]
# The goals of issue 36.
MEDIAN_GOAL, WORST_GOAL = 0.15, 0.35
RANKED = ("eager+sdpa", "compile+sdpa")


def predict(results: Path = H200) -> list:
    """The 16 predictions, from the H200 run only."""
    steps = [m for m in require_profiles(measured([str(results)]), [str(results)])
             if m.setup in SETUPS]
    targets = [gpus.lookup(name) for name in TARGETS]
    return predictions(steps, targets, load_price_file(PRICES))


def published() -> dict:
    """(gpu, setup) -> the published record."""
    rows = {}
    for path in sorted(POST.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            rows[(r["machine"]["gpu"], r["setup"]["name"])] = r
    return rows


def compare(preds: list, post: dict) -> dict:
    rows = []
    for p in preds:
        r = post[(p.gpu, p.setup)]
        measured_ms = r["step_ms"] if r["status"] == "ok" else None
        err = (p.step_ms / measured_ms - 1) if measured_ms and p.fits else None
        rows.append({"gpu": p.gpu, "setup": p.setup, "predicted_ms": p.step_ms,
                     "low_ms": p.step_ms_low, "high_ms": p.step_ms_high,
                     "predicted_fits": p.fits, "measured_status": r["status"],
                     "measured_ms": measured_ms, "error": err,
                     "in_interval": (measured_ms is not None and p.step_ms_low <= measured_ms
                                     <= p.step_ms_high),
                     "predicted_tokens_per_dollar": p.tokens_per_dollar,
                     "measured_tokens_per_dollar": (
                         r["tokens_per_s"] * 3600 / price_for(load_price_file(PRICES), p.gpu)
                         if measured_ms else None)})
    fit_right = sum((row["predicted_fits"] is True) == (row["measured_status"] == "ok")
                    for row in rows)
    errors = [abs(row["error"]) for row in rows if row["error"] is not None]
    rankings = {}
    for setup in RANKED:
        mine = [row for row in rows if row["setup"] == setup]
        order = lambda key: [row["gpu"] for row in sorted(  # noqa: E731
            mine, key=lambda row: -(row[key] or 0))]
        rankings[setup] = {"predicted": order("predicted_tokens_per_dollar"),
                           "measured": order("measured_tokens_per_dollar")}
    return {
        "rows": rows,
        "fit_right": fit_right, "rows_total": len(rows),
        "median_abs_error": statistics.median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
        "measured_rows": len(errors),
        "over_35": sum(e > WORST_GOAL for e in errors),
        "in_interval": sum(row["in_interval"] for row in rows),
        "rankings": rankings,
        "goals": {
            "fit 16/16": fit_right == len(rows) == 16,
            "median <= 15%": bool(errors) and statistics.median(errors) <= MEDIAN_GOAL,
            "none > 35%": bool(errors) and max(errors) <= WORST_GOAL,
            **{f"ranking {s}": r["predicted"] == r["measured"] for s, r in rankings.items()}},
    }


def text(result: dict) -> str:
    lines = [f"{'GPU':24s} {'setup':14s} {'predicted ms':>18s} {'measured':>9s} {'error':>7s}"]
    for row in result["rows"]:
        pred = (f"{row['predicted_ms']:.0f} ({row['low_ms']:.0f}-{row['high_ms']:.0f})"
                if row["predicted_fits"] else "OOM")
        meas = f"{row['measured_ms']:.1f}" if row["measured_ms"] else "OOM"
        err = f"{row['error']:+.1%}" if row["error"] is not None else ""
        lines.append(f"{row['gpu']:24s} {row['setup']:14s} {pred:>18s} {meas:>9s} {err:>7s}")
    lines.append("")
    lines.append(f"fit/OOM right: {result['fit_right']}/{result['rows_total']}")
    lines.append(f"step time over {result['measured_rows']} measured rows: median |error| "
                 f"{result['median_abs_error']:.1%}, worst {result['worst_abs_error']:.1%}, "
                 f"{result['over_35']} over 35%, {result['in_interval']} inside the interval")
    for setup, r in result["rankings"].items():
        lines.append(f"tokens per dollar, {setup}: predicted {', '.join(r['predicted'])}; "
                     f"measured {', '.join(r['measured'])}")
    lines.append("goals: " + ", ".join(f"{k} {'met' if v else 'missed'}"
                                       for k, v in result["goals"].items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--results", type=Path, default=H200,
                        help="the H200 results file to predict from (default: %(default)s)")
    args = parser.parse_args(argv)
    result = compare(predict(args.results), published())
    sys.stdout.write(json.dumps(result, indent=1) + "\n" if args.json else text(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
