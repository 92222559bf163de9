"""A stand-in for the post's training-step script, for rehearsing the GPU chain on a CPU
(`REHEARSE=1 bash benchmarks/gpu_chain_hf_user_wander.sh`): the post's script is not in this
repository, but the chain and gpu_wander.py call it as `python3 SEED MODE ATTN [BATCH]` and read
its one JSON line (benchmarks/compare_seed.py, wander_table.py). This script takes the same
command line and prints a line with the same fields (mode, attn, B, first_step_s, step_ms,
tokens_per_s, peak_gb, params_M; {"oom": true} when out of memory), measured on llama-tiny's
shape (stepbench's preset) at SEQ tokens (default 64), bf16 weights, on CUDA when there is one,
else the CPU.
Its line also says `"standin": true`: its numbers are never the post's script's.

    SEED=benchmarks/seed_standin.py REHEARSE=1 JOB=/tmp/job bash benchmarks/gpu_chain_hf_user_wander.sh
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

FIRST, WARMUP, TIMED = 1, 4, 20     # the post's method: first step alone, 4 warm-up, 20 timed


def main(argv: list[str]) -> dict:
    mode, attn = argv[0], argv[1]
    batch = int(argv[2]) if len(argv) > 2 else 4
    seq = int(os.environ.get("SEQ", 64))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    # llama-tiny's sizes (src/stepbench/workload/hf.py PRESETS), written out: no stepbench here.
    cfg = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=max(seq, 2048), attn_implementation=attn)
    model = LlamaForCausalLM(cfg).to(device, dtype=torch.bfloat16)   # bf16 weights, as stepbench
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    forward = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step() -> None:
        loss = forward(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = {"mode": mode, "attn": attn, "B": batch, "standin": True}
    try:
        t0 = time.perf_counter()
        step()
        sync()
        first = time.perf_counter() - t0
        for _ in range(WARMUP):
            step()
        sync()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(TIMED):
            step()
        sync()
        dt = (time.perf_counter() - t0) / TIMED
    except torch.OutOfMemoryError:
        return {**out, "oom": True}
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None
    return {**out, "first_step_s": first, "step_ms": dt * 1000, "tokens_per_s": batch * seq / dt,
            "peak_gb": peak, "params_M": sum(p.numel() for p in model.parameters()) / 1e6}


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: seed_standin.py MODE ATTN [BATCH]")
    print(json.dumps(main(sys.argv[1:])), flush=True)
