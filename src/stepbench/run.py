"""`stepbench run`: turn flags into a plan of setups, run it, print the post's table.

Defaults reproduce the post: on a GPU its 468M Llama, batch 4 x 2048, eager/compile x sdpa/eager;
without a GPU the same matrix on the `llama-tiny` preset with 256-token sequences, so that it ends
in a couple of minutes on a laptop CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stepbench import runner, table
from stepbench.display import Display
from stepbench.errors import UserError
from stepbench.models import build_config
from stepbench.setups import Setup, matrix, parse_list

GPU_DEFAULTS = {"model": "llama-468m", "seq": "2048", "timeout": 1800.0}
CPU_DEFAULTS = {"model": "llama-tiny", "seq": "256", "timeout": 600.0}
DEFAULT_OUT = "stepbench-results.jsonl"
RUN_FORMATS = ("table", "markdown", "json")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="run the matrix of setups, each in its own process",
        description="Run each setup (mode x attention x batch x seq) in its own process and "
                    "record step time, tokens/s, peak memory and first-step (compile) time.")
    p.add_argument("--model", help="preset (llama-468m, llama-small, llama-tiny) or path to an HF "
                   "config.json / folder; default llama-468m on a GPU, llama-tiny on the CPU")
    p.add_argument("--modes", default="eager,compile", help="comma list of eager, compile")
    p.add_argument("--attn", default="sdpa,eager",
                   help="comma list of attention implementations (eager, sdpa, flex_attention, ...)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode(s), comma list: default, reduce-overhead, max-autotune, "
                        "max-autotune-no-cudagraphs")
    p.add_argument("--batch", default="4", help="batch size(s), comma list")
    p.add_argument("--seq", help="sequence length(s), comma list; default 2048 on a GPU, 256 on the CPU")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps after the first (default 4)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--repeats", type=int, default=1,
                   help="processes per setup, interleaved across setups (default 1)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (pure, no autocast)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-limit-gb", type=float,
                   help="cap each child's memory (GPU: a fraction of the card) to see what fits a "
                        "smaller one")
    p.add_argument("--timeout", type=float,
                   help="seconds per setup before its process group is killed (default 1800 on a "
                        "GPU, 600 on the CPU)")
    p.add_argument("--compile-cache", type=Path,
                   help="share this inductor cache folder across setups and runs (default: a fresh "
                        "folder per setup, so the first compile is cold)")
    p.add_argument("--no-peak", action="store_true",
                   help="on a GPU, skip measuring the matmul rate (used for mfu_measured)")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT),
                   help=f"results file, JSON Lines, appended; rerun to resume (default {DEFAULT_OUT})")
    p.add_argument("--format", default="table", choices=RUN_FORMATS,
                   help="table (default), markdown, or json (the records, alone on stdout)")
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    plan = build_plan(args, device)
    timeout = args.timeout if args.timeout is not None else defaults(device)["timeout"]
    if timeout <= 0:
        raise UserError(f"--timeout must be > 0 seconds, got {timeout:g}")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    display = Display()
    try:
        peak = None
        if device == "cuda" and not args.no_peak:
            print("stepbench run: measuring the GPU's matmul rate (for MFU)", file=sys.stderr)
            peak = runner.measure_peak_tflops(args.dtype)
        records = runner.run_plan(plan, args.out, repeats=args.repeats, timeout_s=timeout,
                                  compile_cache=args.compile_cache, display=display,
                                  peak_tflops=peak)
    except KeyboardInterrupt:
        display.close()
        print(f"stepbench run: interrupted; the running setup was stopped, finished setups are "
              f"kept in {args.out}; run the same command again to resume", file=sys.stderr)
        return 130
    print(render_records(records, args.format), end="")
    if args.format != "json":
        print(f"results: {args.out}", file=sys.stderr)
        if args.repeats > 1:
            print(f"repeats combined, with confidence intervals and findings: stepbench report "
                  f"{args.out}", file=sys.stderr)
    return 0


def defaults(device: str) -> dict:
    return GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS


def resolve_device(requested: str) -> str:
    """'auto' picks CUDA when torch sees a GPU; asking for CUDA without one is a user error."""
    import torch

    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise UserError("--device cuda was asked for, but torch sees no CUDA GPU here; use "
                        "--device cpu (or install a CUDA build of torch)")
    if requested == "auto":
        if not available:
            print("stepbench run: no CUDA GPU found; running on the CPU with the llama-tiny preset "
                  "(pass --device cuda on a GPU machine)", file=sys.stderr)
        return "cuda" if available else "cpu"
    return requested


def build_plan(args: argparse.Namespace, device: str) -> list[Setup]:
    """The setups the flags ask for; every model/seq pair is checked before anything runs."""
    base = defaults(device)
    model = args.model or base["model"]
    seqs = parse_list("--seq", args.seq or base["seq"], int)
    plan = matrix(models=[model], modes=parse_list("--modes", args.modes),
                  attns=parse_list("--attn", args.attn), batches=parse_list("--batch", args.batch, int),
                  seqs=seqs, compile_modes=parse_list("--compile-mode", args.compile_mode),
                  dtype=args.dtype, device=device, warmup=args.warmup, steps=args.steps,
                  seed=args.seed, memory_limit_gb=args.memory_limit_gb)
    for seq in seqs:
        build_config(model, seq)
    return plan


COLUMNS = ["Setup", "Batch", "Seq", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)"]


def render_records(records: list[dict], fmt: str) -> str:
    """The post's table, one row per record; failed rows show their status, noisy rows a mark."""
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    from stepbench.report import NOISE_MARKS, STATUS_NOTES  # one wording for run and report
    from stepbench.rows import status_text

    rows, notes = [], {}
    for r in records:
        s = r["setup"]
        name = s["name"] + (f" (repeat {r['repeat'] + 1})" if r.get("repeat") else "")
        if r["status"] == "ok":
            marks = {NOISE_MARKS[f] for f in r["noise_flags"] if f in NOISE_MARKS}
            notes.update({f"{mark} {meaning}.": None for mark, meaning in sorted(marks)})
            rows.append([name, str(s["batch"]), str(s["seq"]),
                         table.num(r["step_ms"]) + "".join(sorted(m for m, _ in marks)),
                         table.num(r["tokens_per_s"], 0, thousands=True),
                         table.gb(r["peak_memory_gb"]), table.num(r["first_step_s"])])
        else:
            rows.append([name, str(s["batch"]), str(s["seq"]), status_text(r["status"]), "", "", ""])
            if r["status"] in STATUS_NOTES:
                notes[STATUS_NOTES[r["status"]]] = None
    return table.render(COLUMNS, rows, "markdown" if fmt == "markdown" else "table",
                        title=_title(records), footnotes=list(notes) or None, align="lrrrrrr")


def _title(records: list[dict]) -> str | None:
    if not records:
        return None
    r = records[0]
    gpu = r["machine"].get("gpu") or "cpu"
    where = gpu if gpu != "cpu" else f"CPU ({r['machine'].get('cpu') or 'unknown'})"
    return f"{r['setup']['model']}, {r['setup']['dtype']}, on {where}"
