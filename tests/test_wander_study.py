"""benchmarks/wander_table.py: the committed wander study's numbers (benchmarks/README.md,
section l) as it prints them now, and the cheap host-bound mark set against a profile's GPU
busy share for records that carry both."""

import importlib.util
import json
from pathlib import Path

from says import names

ROOT = Path(__file__).resolve().parent.parent
PREFIX = ROOT / "benchmarks" / "results" / "h200-2026-12-04-wander"


def table():
    spec = importlib.util.spec_from_file_location("wander_table",
                                                  ROOT / "benchmarks" / "wander_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_study_prints_section_ls_medians(capsys):
    table().main(str(PREFIX))
    lines = capsys.readouterr().out.splitlines()
    server, nvml_off, script = (next(x for x in lines if x.startswith(f"| {w}"))
                                for w in ("stepbench (process server)",
                                          "stepbench, STEPBENCH_NVML=0", "the post's script"))
    assert names(server, "| 9 | 105.0 |", "96.4 - 113.5", "0.987")
    assert names(nvml_off, "| 9 | 104.7 |", "90.3 - 111.7", "0.985")
    assert names(script, "| 9 | 106.4 |", "95.2 - 110.0", "1.000")
    # Records from before the host lead: no lead, no way without its file (pinned).
    assert "--pin-cpus" not in "\n".join(lines) and "| - | 0 of 9 |" in server


def test_profiled_processes_show_the_mark_beside_the_busy_share(tmp_path, capsys):
    def record(step, lead, device_s, flags):
        return {"step_ms": step, "step_ms_median": step, "host_lead_ms": lead,
                "host_lead_offset_ms": 0.004, "noise_flags": flags,
                "profile": {"device_s": device_s, "idle_s": 0.02}}

    prefix = tmp_path / "w"
    Path(f"{prefix}-server.jsonl").write_text("\n".join(json.dumps(r) for r in (
        record(105.0, 0.4, 0.086, ["host_bound"]), record(89.0, 30.0, 0.086, []))) + "\n")
    Path(f"{prefix}-script.jsonl").write_text(json.dumps({"step_ms": 97.0}) + "\n")
    table().main(str(prefix))
    out = capsys.readouterr().out.splitlines()
    assert names(next(x for x in out if x.startswith("| stepbench (process")), "| 2 |",
                 "1 of 2", "15.20")
    profiled = [x for x in out if x.startswith("| 1 |") or x.startswith("| 2 |")]
    assert names(profiled[0], "89.0", "30.00", "| no |", "0.966")
    assert names(profiled[1], "105.0", "0.40", "| yes |", "0.819")
