"""Issue 22's check of a tune on a GPU: the tune's winner measured again, interleaved with the
setups known best from the grid (two processes each, one `Runner` call, through the process
server, warm from the tune's inductor cache), and the winner's tokens/s against the best of them.

    python3 benchmarks/tune_check.py --tune TUNE.json --refs compile:flex_attention:16,... \\
        --compile-cache DIR --out CHECK.jsonl          # measures, then prints the table
    python3 benchmarks/tune_check.py --tune TUNE.json --refs ... --out CHECK.jsonl --table

TUNE.json is `stepbench tune --format json`'s output. A reference is MODE:ATTN:BATCH, at the
winner's model, sequence, precision and steps (other axes at their defaults). The table's figure
per setup is the mean of its processes' tokens/s (the tune names its winner by mean tokens/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SHARED = ("model", "seq", "device", "dtype", "warmup", "steps", "seed", "init")


def setups(tune: dict, refs: str):
    from stepbench.setup import Setup

    winner = Setup.from_dict(tune["winner"]["setup"]) if tune.get("winner") else None
    base = Setup.from_dict({**{k: v for k, v in tune["winner"]["setup"].items() if k in SHARED},
                            "mode": "eager", "attn": "sdpa"})
    references = []
    for ref in filter(None, refs.split(",")):
        mode, attn, batch = ref.split(":")
        references.append(base.replace(mode=mode, attn=attn, batch=int(batch)))
    plan = list(dict.fromkeys(([winner] if winner else []) + references))
    return winner, references, plan


def measure(plan, compile_cache: str, out: str) -> None:
    from stepbench.execute.local.process import LocalProcess
    from stepbench.execute.runner import Runner
    from stepbench.execute.local.server import imports_for
    from stepbench.record import ResultsFile

    executor = LocalProcess(start="server", compile_cache=compile_cache and Path(compile_cache),
                            preload=imports_for(plan), note=lambda text: print(text, file=sys.stderr))
    try:
        Runner(executor, ResultsFile(out)).run(plan, repeats=2, timeout_s=300)
    finally:
        executor.close()


def table(winner, references, plan, out: str) -> list[str]:
    records = [json.loads(line) for line in Path(out).read_text().splitlines() if line.strip()]
    label = {s.key(): ("winner, " if s == winner else "") + f"{s.name} batch {s.batch}"
             + ("" if s.dtype == "bf16" else f" {s.dtype}") for s in plan}
    from stepbench.setup import Setup

    speeds: dict = {}
    for record in records:
        if record.get("status") == "ok":
            key = Setup.from_dict(record["setup"]).key()
            speeds.setdefault(key, []).append(record["tokens_per_s"])
    lines = ["| setup | processes | tokens/s per process | mean tokens/s |", "| --- | ---: | --- | ---: |"]
    for setup in plan:
        got = speeds.get(setup.key(), [])
        lines.append(f"| {label[setup.key()]} | {len(got)} | {', '.join(f'{v:,.0f}' for v in got)} | "
                     + (f"{statistics.mean(got):,.0f} |" if got else "- |"))
    if winner is None or not speeds.get(winner.key()):
        return lines
    mine = statistics.mean(speeds[winner.key()])
    lines.append("")
    for what, among in (("best reference", references),
                        ("best reference other than itself", [s for s in references if s != winner])):
        means = [(statistics.mean(speeds[s.key()]), label[s.key()]) for s in among if speeds.get(s.key())]
        if means:
            best, name = max(means)
            lines.append(f"Winner / {what} ({name}): **{mine / best:.3f}** (goal: 0.95 or more)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", required=True)
    parser.add_argument("--refs", required=True)
    parser.add_argument("--compile-cache")
    parser.add_argument("--out", required=True)
    parser.add_argument("--table", action="store_true", help="print the table of OUT only")
    args = parser.parse_args()
    winner, references, plan = setups(json.loads(Path(args.tune).read_text()), args.refs)
    if not args.table:
        try:
            measure(plan, args.compile_cache, args.out)
        except KeyboardInterrupt:
            print("stopped; the table has what finished", file=sys.stderr)
    print("\n".join(table(winner, references, plan, args.out)))


if __name__ == "__main__":
    main()
