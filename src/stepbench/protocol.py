"""How a setup's process talks to the parent: one JSON object per line on the child's stdout.

The same stream works through a local pipe, torchrun's rank 0 and an SSH channel, so an executor
only has to carry lines. The child sends, in order:

  {"event": "start", "machine": {...}, "software": {...}}    who and where, as soon as it runs
  {"event": "progress", "phase": "warmup", "args": [2, 4], ...}   between steps, never inside
                                                                  the timed window
  {"event": "result", "status": "ok", "error": null, "measured": {...}}   last

The parent decides the status from what arrived, the exit code and the clock: a child that dies
before its result leaves its last phase behind (execute/runner.py).

Input is one JSON job on the command line: {"setup": {...}, "measure_peak": true|false} (whether
the child looks up or measures the GPU's matmul rate for mfu_measured; measure/peaks.py).
"""

from __future__ import annotations

import json

# Set by the executor for a compiled setup: "shared" (a user-given inductor cache) or "private"
# (this setup's own folder: cold on its first process, warm on later repeats).
CACHE_KIND_ENV = "STEPBENCH_COMPILE_CACHE"

# A line that does not parse, or lacks "event", is a stray print and is ignored.
EVENTS = ("start", "progress", "result")


def encode(event: str, **fields) -> str:
    # NaN stays NaN (a diverged loss is a result too); Python's json reads it back.
    return json.dumps({"event": event, **fields}) + "\n"


def decode(line: str | bytes) -> dict | None:
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(message, dict) and message.get("event") in EVENTS:
        return message
    return None
