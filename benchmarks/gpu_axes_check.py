"""On one GPU: a short run of each new axis value on the post's model, with the loss guard's verdict,
in one device call under a deadline (issue 9's GPU verification).

    PYTHONPATH=src python3 benchmarks/gpu_axes_check.py OUT_FOLDER [DEADLINE_S]

The setups run in priority order, each in its own process (the Runner and executor that `stepbench
run` uses), and each one only while the deadline leaves it its time limit: what does not fit is
listed as not run. On a host with several GPUs the setups still to run are split into lanes, one
process per GPU at a time. Warm-up 2, timed steps 5, no matmul-peak pass. The groups:
1. batch 4: the eager+sdpa reference, compile mode reduce-overhead (CUDA graphs), per-layer
   compilation;
2. batch 16: the eager+sdpa reference and compiled flex_attention with each fused-kernel option
   and float8 (the routes past about 150k tokens/s);
3. batch 4, eager: the other values, two or three to a setup (autocast-bf16 + checkpointing +
   foreach; fp32 + liger; float8 + liger-no-flce), so that one process shows each runs.
4. the autotuning compile modes, max-autotune-no-cudagraphs and max-autotune, at batch 4.
Then the table and the loss guard's verdicts (stepbench report reads the same file). The setups
resume from OUT_FOLDER/axes.jsonl: copy a committed file there first to run only what it lacks,
e.g. `cp benchmarks/results/h200-2026-11-30-axes.jsonl $OUT/axes.jsonl`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from stepbench.execute.local.process import LocalProcess
from stepbench.execute.progress import Display
from stepbench.execute.runner import Runner
from stepbench.guard import loss_verdicts
from stepbench.measure.telemetry import gpu_count
from stepbench.record import ResultsFile
from stepbench.setup import Setup

COMMON = dict(model="llama-468m", seq=2048, device="cuda", warmup=2, steps=5)


def s(mode: str, attn: str, batch: int, **options) -> Setup:
    return Setup(mode=mode, attn=attn, batch=batch, **COMMON, **options).check()


# (setup, its time limit in seconds), most wanted first.
PLAN = [
    (s("eager", "sdpa", 4), 90),
    (s("compile", "sdpa", 4, compile_mode="reduce-overhead"), 150),
    (s("eager", "sdpa", 16), 90),
    (s("compile", "flex_attention", 16), 150),
    (s("compile", "flex_attention", 16, kernels="liger-no-flce"), 150),
    (s("compile", "flex_attention", 16, kernels="liger"), 150),
    (s("eager", "sdpa", 4, dtype="autocast-bf16", checkpointing=True, optimizer="foreach"), 90),
    (s("eager", "sdpa", 4, dtype="fp32", kernels="liger"), 90),
    (s("eager", "sdpa", 4, dtype="float8", kernels="liger-no-flce"), 90),
    (s("compile", "sdpa", 4, compile_scope="layer"), 120),
    (s("compile", "flex_attention", 16, dtype="float8", kernels="liger"), 120),
    (s("compile", "flex_attention", 16, dtype="float8"), 150),
    # Not run in the first call (2026-11-30, out of device time): autotuning compiles for minutes
    # (the second call, 2026-12-01, stopped both at 300 s in the first step).
    (s("compile", "sdpa", 4, compile_mode="max-autotune-no-cudagraphs"), 570),
    (s("compile", "sdpa", 4, compile_mode="max-autotune"), 570),
]


def lanes(plan: list[tuple[Setup, int]], count: int) -> list[list[tuple[Setup, int]]]:
    """Split the plan over `count` GPUs, each setup to the lane with the least time so far, in
    priority order (so every lane starts with what is most wanted)."""
    out: list[list[tuple[Setup, int]]] = [[] for _ in range(max(count, 1))]
    for item in plan:
        min(out, key=lambda lane: sum(limit for _, limit in lane)).append(item)
    return out


def run_lane(lane: list[tuple[Setup, int]], gpu: int | None, store: ResultsFile, end: float,
             skipped: list[Setup]) -> None:
    executor = LocalProcess(gpus=None if gpu is None else [gpu])
    runner, display = Runner(executor, store, measure_peak=False), Display()
    try:
        for setup, limit in lane:
            left = end - time.monotonic()
            if left < min(limit, 60):
                skipped.append(setup)
                continue
            runner.run([setup], timeout_s=min(limit, left), display=display)
    finally:
        display.close()
        executor.close()


def main(out: Path, deadline_s: float) -> int:
    end = time.monotonic() + deadline_s
    out.mkdir(parents=True, exist_ok=True)
    store = ResultsFile(out / "axes.jsonl")
    done = {r.setup.key() for r in store.latest()}
    todo = [(setup, limit) for setup, limit in PLAN if setup.key() not in done]
    # With several GPUs on the host, the setups still to run go out in lanes, one process per GPU.
    gpus = gpu_count() or 1
    skipped: list[Setup] = []
    threads = [threading.Thread(target=run_lane,
                                args=(lane, i if gpus > 1 else None, store, end, skipped))
               for i, lane in enumerate(lanes(todo, gpus)) if lane]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = store.latest()
    verdicts = loss_verdicts(records)
    for r in records:
        v = verdicts.get((r.setup.key(), r.machine.gpu))
        print(json.dumps({"setup": r.setup.name, "batch": r.setup.batch, "precision": r.setup.dtype,
                          "status": r.status, "step_ms": r.step_ms, "tokens_per_s": r.tokens_per_s,
                          "peak_memory_gb": r.peak_memory_gb, "peak_memory_source": r.peak_memory_source,
                          "first_step_s": r.first_step_s, "loss_first": r.loss_first,
                          "loss_last": r.loss_last, "guard": v and v.status,
                          "guard_reference": v and v.reference, "guard_max_rel_diff": v and v.max_rel_diff,
                          "error": (r.error or "")[:300]}))
    for setup in skipped:
        print(f"not run (deadline): {setup.name} batch {setup.batch} {setup.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 480))
