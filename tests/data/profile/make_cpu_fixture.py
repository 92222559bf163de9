"""Write tests/data/profile/cpu-llama-tiny-gemms.json.gz: the GEMM ops of one real profiled CPU
step (eager+sdpa of llama-tiny, batch 4 x 256, bf16; `stepbench run --device cpu --model
llama-tiny --seq 256 --modes eager --attn sdpa --repeats 1 --warmup 1 --steps 2 --profile DIR`,
stepbench 2026-12-04, torch 2.13.0 CPU, record_shapes and with_flops on) with only the fields
measure/kernels.py reads; the other ops are left out (the full trace is 55 kB).
Run from the repository root: .venv/bin/python tests/data/profile/make_cpu_fixture.py TRACE.json.gz
"""

import gzip
import json
import sys
from pathlib import Path

from stepbench.measure.kernels import GEMM_OPS

HERE = Path(__file__).parent
KEEP_ARGS = ("External id", "Input Dims", "Input type")


def main() -> None:
    source = Path(sys.argv[1])
    trace = json.load(gzip.open(source))
    events = [{"ph": e["ph"], "cat": e["cat"], "name": e["name"], "ts": e["ts"], "dur": e["dur"],
               "args": {k: e["args"][k] for k in KEEP_ARGS if k in e["args"]}}
              for e in trace["traceEvents"]
              if e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS]
    out = {"traceEvents": events, "source": source.name}
    with gzip.open(HERE / "cpu-llama-tiny-gemms.json.gz", "wt", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
