"""Live progress on stderr while a plan runs: which setup, which phase, how long.

On a terminal a rich status line is redrawn in place; elsewhere (CI logs, pipes, the GPU
machine's captured output) one plain line is printed per phase change, so logs stay readable.
stdout is never touched: it carries the table or the JSON.
"""

from __future__ import annotations

import sys

from stepbench.setups import Setup

PHASE_TEXT = {
    "starting": "starting Python",
    "building": "building the model",
    "first_step": "first step",
    "warmup": "warm-up",
    "timed": "timed steps",
    "done": "finishing",
}


def describe(progress: dict) -> str:
    """'warm-up 2/4', 'first step (compiling)', 'timed steps (20, not shown one by one)'."""
    phase = progress.get("phase", "starting")
    text = PHASE_TEXT.get(phase, phase)
    args = progress.get("args") or []
    if phase == "first_step" and progress.get("compiling"):
        return "first step (compiling)"
    if phase == "warmup" and len(args) == 2:
        return f"{text} {args[0]}/{args[1]}"
    if phase == "timed" and args:
        # Nothing is reported from inside the timed window: that would disturb what is measured.
        return f"{text} ({args[0]})"
    return text


class Display:
    """The runner's display: redraws a status line on a terminal, prints lines elsewhere."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.status = None
        self.label = ""
        self.last_line = None

    def _print(self, text: str) -> None:
        if self.status is not None:
            self.status.console.print(text, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def skip(self, setup: Setup, repeat: int, record: dict) -> None:
        self._print(f"stepbench: {self._name(setup, repeat)}: already in the results file "
                    f"({record['status']}), skipped")

    def start(self, index: int, total: int, setup: Setup, repeat: int) -> None:
        self.label = f"[{index}/{total}] {self._name(setup, repeat)}"
        self.last_line = None
        if self.live and self.status is None:
            from rich.console import Console

            self.status = Console(file=self.stream).status(self.label)
            self.status.start()
        self.progress({"phase": "starting"}, 0.0)

    def progress(self, progress: dict, elapsed_s: float) -> None:
        line = f"{self.label}: {describe(progress)}"
        if self.status is not None:
            self.status.update(f"{line} [{elapsed_s:.0f} s]")
        elif line != self.last_line:
            print(f"stepbench: {line}", file=self.stream, flush=True)
        self.last_line = line

    def finish(self, record: dict) -> None:
        if record["status"] == "ok":
            summary = f"ok, {record['step_ms']:.1f} ms/step"
        else:
            summary = f"{record['status'].upper()}: {(record['error'] or '').splitlines()[0][:160]}"
        self._print(f"stepbench: {self.label}: {summary} ({record['wall_s']:.0f} s)")

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    @staticmethod
    def _name(setup: Setup, repeat: int) -> str:
        extra = f" batch {setup.batch} seq {setup.seq}"
        return setup.name + extra + (f" (repeat {repeat + 1})" if repeat else "")
