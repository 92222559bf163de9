"""Write the report layout case "one H200, six result files, three models" (not measurements).

The three real H200 files in benchmarks/results (matrix, repeats3, sdpa-repeats4) are llama-468m;
this script adds three files for two more models, named the way users pass them, by a long
config path: a .json file and a folder's config.json. Their records are copies of the real ones
with setup.model replaced, step times scaled by a per-model factor (FLOPs per token and energy
per step scaled alike, so MFU stays the measured one) and peak memory scaled: plausible numbers
for a page's layout and labels, never for a claim about these models.
Run from the repository root: .venv/bin/python tests/data/report-models/make_records.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE.parents[2] / "benchmarks" / "results"
# (output file, source file, model path as a user passes it, step-time factor, memory factor)
CASES = [
    ("h200-smollm2-135m-matrix.jsonl", "h200-2026-11-30-matrix.jsonl",
     "/home/alice/experiments/2026-11/model-configs/gqa/smollm2-135m.json", 0.35, 0.45),
    ("h200-qwen2.5-0.5b-matrix.jsonl", "h200-2026-11-30-matrix.jsonl",
     "/home/alice/experiments/2026-11/model-configs/gqa/qwen2.5-0.5b/config.json", 1.2, 1.3),
    ("h200-qwen2.5-0.5b-sdpa-repeats4.jsonl", "h200-2026-11-30-sdpa-repeats4.jsonl",
     "/home/alice/experiments/2026-11/model-configs/gqa/qwen2.5-0.5b/config.json", 1.2, 1.3),
]
TIME_FIELDS = ["step_ms", "step_ms_median", "step_ms_min", "step_ms_max", "step_ms_std",
               "timed_wall_s"]
MEMORY_FIELDS = ["peak_memory_gb", "peak_reserved_gb", "oom_memory_gb"]


def scaled(record: dict, model: str, time: float, memory: float) -> dict:
    rec = json.loads(json.dumps(record))
    rec["setup"]["model"] = model
    rec["run_id"] += f"-{Path(model).stem}"
    for name in TIME_FIELDS:
        if rec.get(name) is not None:
            rec[name] *= time
    rec["step_times_ms"] = [t * time for t in rec["step_times_ms"]]
    if rec.get("tokens_per_s"):
        rec["tokens_per_s"] /= time
    for name in ("flops_per_token", "flops_per_token_causal", "flop_counter_per_step"):
        if rec.get(name) is not None:
            rec[name] *= time
    for name in MEMORY_FIELDS:
        if rec.get(name) is not None:
            rec[name] *= memory
    if rec.get("energy"):
        rec["energy"]["joules_per_step"] *= time
        rec["energy"]["tokens_per_kwh"] /= time
    return rec


def main() -> None:
    for out, source, model, time, memory in CASES:
        lines = (RESULTS / source).read_text().splitlines()
        records = [scaled(json.loads(line), model, time, memory) for line in lines]
        (HERE / out).write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
