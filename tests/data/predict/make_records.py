"""Write tests/data/predict/h200-profile-matrix.jsonl: the H200 default matrix measured with
--profile (benchmarks/results/h200-2026-12-04-profile-matrix.jsonl, written before profile_step
sorted kernels into classes), with each record's profile completed from its stored trace as
profile_step now writes it (measure/kernels.py), and the trace paths made relative.
Run from the repository root: .venv/bin/python tests/data/predict/make_records.py
"""

import json
from pathlib import Path

from stepbench.measure import kernels

ROOT = Path(__file__).resolve().parent.parent.parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "h200-2026-12-04-profile-matrix.jsonl"
TRACES = RESULTS.with_name(RESULTS.stem + "-traces")


def main() -> None:
    lines = []
    for line in RESULTS.read_text().splitlines():
        record = json.loads(line)
        profile = record.get("profile") or {}
        if profile.get("trace"):
            name = Path(profile["trace"]).name
            profile.update(kernels.split_trace(TRACES / name))
            profile["trace"] = f"{TRACES.relative_to(ROOT)}/{name}"
            profile["table"] = f"{TRACES.relative_to(ROOT)}/{Path(profile['table']).name}"
        lines.append(json.dumps(record))
    (Path(__file__).parent / "h200-profile-matrix.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
