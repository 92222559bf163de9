"""Write stepbench records for eager+sdpa (4 processes) and compile+sdpa (2) on one H200.

Source: /work/shared/anchors (2026-11-30, torch 2.11.0+cu130, transformers 5.17.0, batch 4 x
2048, bf16). Measured there and copied: every per-step time (h200-variance-2026-11-30.jsonl:
4 eager and 2 compiled processes, 40 timed steps each), peak memory, and first-step times of a
cold and a warm inductor cache (70.8 s and 6.6 s, from h200-seed-script-2026-11-30.jsonl, other
processes of the same setups). Derived: step_ms and its spread from the step times, tokens/s,
noise_flags (stats.noise_flags_for), MFU against the measured 796.4 TFLOP/s with the README's
3.217e9 FLOPs per token. Not measured, left null: losses, telemetry, energy.
Run from the repository root: .venv/bin/python tests/data/report-h200/make_records.py
"""

import json
import statistics
from pathlib import Path

from stepbench.noise import noise_flags_for

HERE = Path(__file__).parent
ANCHORS = Path("/work/shared/anchors/h200-variance-2026-11-30.jsonl")
FLOPS_PER_TOKEN = 3.217e9
PEAK_TFLOPS = 796.4
PEAK_GB = {"eager": 17.378588, "compile": 13.389675}
FIRST_STEP_S = {"eager": [2.39, 0.64, 0.64, 0.64], "compile": [70.81, 6.57]}


def record(mode: str, repeat: int, steps: list[float]) -> dict:
    step_ms = statistics.fmean(steps)
    tokens_per_s = 4 * 2048 / (step_ms / 1000)
    achieved = FLOPS_PER_TOKEN * tokens_per_s / 1e12
    return {
        "schema": 1, "run_id": "20261130T101500Z-h200", "repeat": repeat,
        "setup": {"name": f"{mode}+sdpa", "model": "llama-468m", "mode": mode,
                  "compile_mode": "default", "attn": "sdpa", "batch": 4, "seq": 2048,
                  "dtype": "bf16", "device": "cuda", "warmup": 5, "steps": 40, "seed": 0,
                  "memory_limit_gb": None},
        "status": "ok", "error": None, "phase": "done", "params": 468239360,
        "first_step_s": FIRST_STEP_S[mode][repeat], "step_ms": step_ms,
        "step_ms_median": statistics.median(steps), "step_ms_min": min(steps),
        "step_ms_max": max(steps), "step_ms_std": statistics.stdev(steps),
        "step_times_ms": steps, "timed_wall_s": sum(steps) / 1000,
        "tokens_per_s": tokens_per_s, "peak_memory_gb": PEAK_GB[mode], "peak_reserved_gb": None,
        "oom_memory_gb": None, "loss_first": None, "loss_last": None, "losses": [],
        "started_at": "2026-11-30T10:15:00Z", "finished_at": "2026-11-30T10:17:00Z",
        "wall_s": 120.0,
        "machine": {"gpu": "NVIDIA H200", "gpu_count": 1, "gpu_memory_gb": 150.1,
                    "driver": "580.159.04", "hostname": None, "cpu": None, "cpu_count": None},
        "software": {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.17.0",
                     "stepbench": None, "cuda": "13.0"},
        "flops_per_token": FLOPS_PER_TOKEN, "flops_per_token_causal": None,
        "flops_convention": "6*N' + 12*L*d*T", "flop_counter_per_step": None,
        "achieved_tflops": achieved, "peak_tflops_datasheet": None,
        "peak_tflops_measured": PEAK_TFLOPS, "mfu_datasheet": None,
        "mfu_measured": achieved / PEAK_TFLOPS,
        "compile": ({"cache": "cold" if repeat == 0 else "warm"} if mode == "compile" else None),
        "telemetry": None, "energy": None, "noise_flags": noise_flags_for(steps),
    }


def main() -> None:
    counts = {"eager": 0, "compile": 0}
    lines = []
    for line in ANCHORS.read_text().splitlines():
        source = json.loads(line)
        mode = source["mode"]
        lines.append(json.dumps(record(mode, counts[mode], source["steps_ms"])))
        counts[mode] += 1
    (HERE / "h200-repeats.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
