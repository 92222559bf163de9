"""Write the post's published results table as stepbench result records (schema 1).

Source: /work/shared/seed/torch-compile-vs-eager-post.txt, "Results" (4 GPUs x 4 setups, batch
4 x 2048, bf16, 2026-10-29). The post gives means only, so step_times_ms is empty and every
measurement-quality field is null. step_ms is derived from the published tokens/s
(8192 / tokens_per_s), which reproduces the published step times to the millisecond, so that
the report's tokens/s equals the post's exactly. One file per machine, as `stepbench run` would
write them. Run from the repository root: .venv/bin/python tests/data/post/make_records.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
TOKENS = 4 * 2048
# (driver name, file name, GPU memory GB as torch reports it, $/hour from the post)
MACHINES = [
    ("NVIDIA GeForce RTX 5090", "1-rtx5090", 33.7, 1.15),
    ("NVIDIA L40S", "2-l40s", 47.7, 0.54),
    ("NVIDIA RTX A6000", "3-a6000", 51.0, 0.65),
    ("NVIDIA H100 PCIe", "4-h100", 85.0, 3.86),
]
SETUPS = [("eager", "sdpa"), ("compile", "sdpa"), ("eager", "eager"), ("compile", "eager")]
# Per GPU, per setup: (tokens/s, peak GB, first step s) or None for OOM, as published.
TABLE = {
    "NVIDIA GeForce RTX 5090": [(41870, 17.3, 0.6), (38040, 13.3, 21.6), None, None],
    "NVIDIA L40S": [(33581, 17.3, 0.6), (34691, 13.3, 34.2), None, (20973, 39.1, 38.9)],
    "NVIDIA RTX A6000": [(17942, 17.3, 0.7), (18005, 13.3, 39.2), None, (15017, 39.1, 47.1)],
    "NVIDIA H100 PCIe": [(54022, 17.4, 0.4), (51055, 13.4, 36.4), (18813, 56.0, 0.7),
                         (48469, 39.1, 43.9)],
}
QUALITY_NULLS = ["flops_per_token", "flops_per_token_causal", "flop_counter_per_step",
                 "achieved_tflops", "peak_tflops_datasheet", "peak_tflops_measured",
                 "mfu_datasheet", "mfu_measured", "compile", "telemetry", "energy"]


def record(gpu: str, memory_gb: float, mode: str, attn: str, measured) -> dict:
    setup = {"name": f"{mode}+{attn}", "model": "llama-468m", "mode": mode,
             "compile_mode": "default", "attn": attn, "batch": 4, "seq": 2048, "dtype": "bf16",
             "device": "cuda", "warmup": 4, "steps": 20, "seed": 0, "memory_limit_gb": None}
    rec = {"schema": 1, "run_id": "20261029T120000Z-post", "repeat": 0, "setup": setup,
           "status": "ok", "error": None, "phase": "done", "params": 468239360}
    if measured is None:
        rec.update(status="oom", phase="first_step",
                   error="torch.OutOfMemoryError: CUDA out of memory.")
        tokens_per_s = peak = first = step_ms = None
    else:
        tokens_per_s, peak, first = measured
        step_ms = TOKENS / tokens_per_s * 1000
    rec.update({
        "first_step_s": first, "step_ms": step_ms, "step_ms_median": None, "step_ms_min": None,
        "step_ms_max": None, "step_ms_std": None, "step_times_ms": [],
        "timed_wall_s": None if step_ms is None else step_ms * 20 / 1000,
        "tokens_per_s": tokens_per_s, "peak_memory_gb": peak, "peak_reserved_gb": None,
        "oom_memory_gb": None, "loss_first": None, "loss_last": None,
        "started_at": "2026-10-29T12:00:00Z", "finished_at": "2026-10-29T12:01:00Z",
        "wall_s": 60.0,
        "machine": {"gpu": gpu, "gpu_count": 1, "gpu_memory_gb": memory_gb, "driver": None,
                    "hostname": None, "cpu": None, "cpu_count": None},
        "software": {"python": "3.12", "torch": "2.8.0+cu128", "transformers": "4.57.1",
                     "stepbench": None, "cuda": "12.8"},
        "losses": [], "flops_convention": None, "noise_flags": []})
    rec.update(dict.fromkeys(QUALITY_NULLS))
    return rec


def main() -> None:
    prices = ["# Dollars per hour, on-demand at launch time (2026-10-29), from the post.",
              "[prices]"]
    for gpu, stem, memory_gb, price in MACHINES:
        lines = [json.dumps(record(gpu, memory_gb, mode, attn, measured))
                 for (mode, attn), measured in zip(SETUPS, TABLE[gpu])]
        (HERE / f"{stem}.jsonl").write_text("\n".join(lines) + "\n")
        prices.append(f'"{gpu}" = {price}')
    (HERE / "prices.toml").write_text("\n".join(prices) + "\n")


if __name__ == "__main__":
    main()
