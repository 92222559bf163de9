"""Write tests/data/profile/h200-eager-sdpa-kernels.json.gz: the device events (kernels,
memcpy, memset) of one real profiled step, eager+sdpa of llama-468m at batch 4 x 2048 on an
H200 (benchmarks/results/h200-2026-12-02-eager-sdpa-wander-profiles/, repeat r1), with only the
fields measure/kernels.py reads; the CPU ops are left out (the full trace is 0.6 MB).
Run from the repository root: .venv/bin/python tests/data/profile/make_fixture.py
"""

import gzip
import json
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = (HERE.parent.parent.parent / "benchmarks" / "results"
          / "h200-2026-12-02-eager-sdpa-wander-profiles"
          / "eager+sdpa_llama-468m_4x2048_bf16_20261202T042325Z-33253e_r1.json.gz")
KEEP = ("kernel", "gpu_memcpy", "gpu_memset")


def main() -> None:
    trace = json.load(gzip.open(SOURCE))
    events = [{"ph": e["ph"], "cat": e["cat"], "name": e["name"], "ts": e["ts"], "dur": e["dur"],
               "args": {"stream": e["args"].get("stream")}}
              for e in trace["traceEvents"] if e.get("cat") in KEEP]
    out = {"deviceProperties": trace.get("deviceProperties"), "traceEvents": events,
           "source": SOURCE.name}
    with gzip.open(HERE / "h200-eager-sdpa-kernels.json.gz", "wt", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
