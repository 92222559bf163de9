"""What a tune found, as the report reads it: the stages by name, each measurement with the
stage that asked for it, and the TuneResult (`stepbench tune --format json`'s object).

The report (report/tune.py) imports these types and nothing else of the search: it draws a
result and never runs one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepbench.record import Record
from stepbench.setup import Setup

# The stages, in order, as the records' `search.stage` and the JSON name them.
STAGES = {"ladder": "the loss guard's eager reference measured at doubling batches",
          "compiled": "torch.compile with each attention kernel at the ladder's saturating "
                      "batch and the one below",
          "explore": "one change on a measured setup, chosen by value per second",
          "reference": "the loss guard's reference at a leading setup's batch the ladder did "
                       "not reach",
          "final": "another process of one of the two best setups"}


@dataclass
class Tried:
    """One measurement the tune used, with the stage that asked for it."""

    stage: str
    record: Record


@dataclass
class TuneResult:
    objective: str
    budget_s: float
    spent_s: float
    winner: Record | None
    runner_up: Record | None
    tried: list[Tried]
    skipped: list[str]          # what was not tried, and why (budget, pruning, this machine)
    command: str | None         # the `stepbench run` that measures the winner again
    comparison: dict | None     # winner against runner-up: ratio, p_value, significant, method
    measured_in_full: bool      # the winner ran the final steps (an earlier tune's could not)
    reference: Record | None = None   # the loss guard's eager reference at the winner's batch
    ladder: dict | None = None        # the reference ladder: batches, saturating batch, why
    gains: list[dict] = field(default_factory=list)   # the gain table entries the tune used
    earlier: str | None = None        # what became of an earlier tune's records in the file
    processes: dict | None = None     # processes measured of the winner and the runner-up
    not_measured: list[dict] = field(default_factory=list)   # candidates left, and why
    stopped: bool = False       # stopped (Ctrl-C, SIGTERM, SIGHUP) before it chose: no winner
    ended: str | None = None    # why it stopped exploring, in one line
    # setups measured host-bound here whose launch-cutting candidates ran first, and why
    # (search/tune/launches.py: setup, host_lead_ms, step_ms, candidates, reason)
    host_bound: list[dict] = field(default_factory=list)
    # the winner and runner-up (labels) whose every process that counts was disturbed
    disturbed: list[str] = field(default_factory=list)
    # the winner (its label) where the loss guard compared none of its losses: its step draws
    # random numbers (dropout), which compiled code draws apart from eager
    unchecked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"winner": self.winner.to_dict() if self.winner else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "tried": [t.record.to_dict() for t in self.tried],
                "command": self.command, "objective": self.objective,
                "budget_s": self.budget_s, "spent_s": round(self.spent_s, 1),
                "comparison": self.comparison, "measured_in_full": self.measured_in_full,
                "reference": self.reference.to_dict() if self.reference else None,
                "skipped": self.skipped, "stages": STAGES, "ladder": self.ladder,
                "gains": self.gains, "earlier_tune": self.earlier,
                "processes": self.processes, "not_measured": self.not_measured,
                "stopped": self.stopped, "ended": self.ended, "host_bound": self.host_bound,
                "disturbed": self.disturbed, "unchecked": self.unchecked}

    @classmethod
    def from_dict(cls, data: dict) -> "TuneResult":
        """A tune's `--format json` object read back, to render it again. Each tried record's
        stage is in its `search` tag (`stage`, one of STAGES; an earlier tune's records: screen,
        batch, option, reference or final reference, else their role, "final")."""
        def record(value):
            return Record.from_dict(value) if value else None

        tried = [Tried(stage_of(r), r) for r in map(Record.from_dict, data["tried"])]
        return cls(data["objective"], data["budget_s"], data["spent_s"], record(data["winner"]),
                   record(data["runner_up"]), tried, list(data["skipped"]), data["command"],
                   data["comparison"], data["measured_in_full"], record(data.get("reference")),
                   data.get("ladder"), list(data.get("gains") or []), data.get("earlier_tune"),
                   data.get("processes"), list(data.get("not_measured") or []),
                   data.get("stopped", False), data.get("ended"),
                   list(data.get("host_bound") or []), list(data.get("disturbed") or []),
                   list(data.get("unchecked") or []))


def stage_of(record: Record) -> str:
    """A tune record's stage: its `stage`, else its role (an earlier tune's finals)."""
    tag = record.search or {}
    return tag.get("stage") or tag.get("role") or "?"


def is_earlier(record: Record) -> bool:
    """A record of an earlier stepbench tune: a short probe, or a measurement whose stage is
    not one of STAGES."""
    tag = record.search or {}
    return tag.get("kind") == "tune" and (tag.get("role") == "probe"
                                          or tag.get("stage") not in STAGES)


def label(setup: Setup) -> str:
    """"compile+sdpa batch 8 bf16"; a factory's parameters after it ("eager batch 4 bf16
    (width=64)")."""
    params = f" ({setup.params})" if setup.params else ""
    return f"{setup.name} batch {setup.batch} {setup.dtype}{params}"
