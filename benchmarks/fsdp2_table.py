"""Issue 26's table: every setup of stepbench results files and torchtitan_fsdp2.py's lines, with
its wrapping, step time, tokens/s per GPU, scaling efficiency (as recorded at run time, against
the one-GPU setup compiled whole in bf16) and its step against each one-GPU baseline of the
same mode (compiled whole and per layer).

    PYTHONPATH=src python3 benchmarks/fsdp2_table.py RESULTS.jsonl [TORCHTITAN.jsonl ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from stepbench.setup import Setup  # noqa: E402


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows(paths: list[Path]) -> list[dict]:
    """One row per record, stepbench's and torchtitan's alike."""
    out = []
    for path in paths:
        for r in lines(path):
            setup = Setup.from_dict(r["setup"])
            recipe = "torchtitan" if "recipe" in r else "stepbench"
            ok = r.get("status") == "ok" and r.get("step_ms")
            scaling = r.get("scaling") or {}
            out.append({
                "recipe": recipe, "setup": setup, "ok": ok, "status": r.get("status"),
                "error": (r.get("error") or "").splitlines()[0][:90] if not ok else "",
                "step_ms": r.get("step_ms_median") if ok else None,
                "per_gpu": (r["tokens_per_s"] / setup.world_size) if ok else None,
                "efficiency": scaling.get("efficiency"),
                "peak_gb": r.get("peak_memory_gb"), "spread": scaling.get("rank_step_ms_spread"),
                "source": (r.get("recipe") or {}).get("source"),
            })
    return out


def table(all_rows: list[dict]) -> str:
    plain = {(r["setup"].mode, r["setup"].compile_scope): r for r in all_rows
             if r["recipe"] == "stepbench" and not r["setup"].distributed and r["ok"]}
    head = ("recipe", "setup", "precision", "procs", "wrapping", "median step ms",
            "tokens/s/GPU", "efficiency", "vs 1 GPU whole", "vs 1 GPU per layer", "peak GB")
    body = []
    for r in all_rows:
        s = r["setup"]
        whole, layer = plain.get((s.mode, "model")), plain.get((s.mode, "layer"))

        def against(base):
            if base is None or r["per_gpu"] is None:
                return "-"
            return f"{r['per_gpu'] / base['per_gpu']:.1%}"

        wrapping = s.wrapping or "-"
        if r["recipe"] == "torchtitan":
            wrapping = f"torchtitan ({r['source']})"
        body.append((r["recipe"], s.name, s.dtype, s.parallel_label, wrapping,
                     f"{r['step_ms']:.1f}" if r["step_ms"] else r["status"] + " " + r["error"],
                     f"{r['per_gpu']:,.0f}" if r["per_gpu"] else "-",
                     f"{r['efficiency']:.1%}" if r["efficiency"] is not None else "-",
                     against(whole), against(layer) if s.mode == "compile" else "-",
                     f"{r['peak_gb']:.1f}" if r["peak_gb"] else "-"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*row) for row in body])


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:] if Path(p).exists()]
    print(table(rows(paths)))
