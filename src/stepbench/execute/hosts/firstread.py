"""A factory's signature read over a host's own SSH connection (execute/elsewhere.py): on each SSH
host before the run (site.py), and on each rented machine, which does not exist before the run,
as it is prepared (`FirstRead`), before any setup's job is sent to it.

Each rented machine's thread (fleet.py) calls `FirstRead.before_plan` once its machine is
prepared, to make its plan: every machine reads the factories there with workload/sigreader.py
(the machine's Python and --remote-setup, as its setups' processes see their packages). The first
one's answers are the run's (unless SSH hosts answered before the run: theirs are): it makes its
plan with them, while the others wait. A read that refuses the factory there (a --param it does
not take, a module the machine lacks) stops every host and rented machine; the run then deletes
them and raises the refusal (one line, exit 2). Each other machine must read what the run's
answer says (elsewhere.agreed, as the SSH hosts must): one that does not (it lacks the module,
or has another version) fails with that line and is deleted, its setups not run; the others go
on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, TypeVar

from stepbench.errors import UserError
from stepbench.execute.hosts.ssh import HostError, HostStopped
from stepbench.workload import sigreader

WAIT_S = 0.5        # how often a waiting machine's thread looks whether it was stopped
Plan = TypeVar("Plan")


def read_on(host, models: list[str]) -> dict:
    """model -> sigreader's fields, for each model the connected `host` answered."""
    source = Path(sigreader.__file__).read_text()
    found = {}
    for model in models:
        fields = sigreader.parse(host.run_python(source, model))
        if fields is not None:
            found[model] = fields
    return found


class FirstRead:
    """The factories each rented machine of a run reads as it is prepared, and the answers they
    must agree with: the first machine's, or `known` (model -> (SSH host, fields)), read on the
    SSH hosts before the run."""

    def __init__(self, models: list[str], stop_all: Callable[[], None],
                 known: dict[str, tuple[str, dict]] | None = None):
        self.models, self.stop_all = list(dict.fromkeys([*models, *(known or {})])), stop_all
        self.refused: UserError | None = None       # the one line the run ends with
        self.answers = dict(known or {})            # model -> (machine, fields) of the run
        self.what = "machine" if known else "rented machine"
        self._claimed = bool(known)                 # no first machine reads for the run
        self._lock = threading.Lock()
        self._done = threading.Event()
        if known:
            self._done.set()

    def before_plan(self, host, note: Callable[[str], None], stopped: Callable[[], bool],
                    make: Callable[[], Plan]) -> Plan:
        """In a machine's thread, once it is prepared: its plan, `make` (which checks it). Each
        machine reads there; the first makes its plan with what it read (a refusal stops every
        machine); the others wait for that, then must agree with it (a UserError naming the
        machine, where one does not) and make theirs. Raises HostStopped where the run stops."""
        if not self.models:
            return make()
        found, why = self._read(host)
        with self._lock:
            first, self._claimed = not self._claimed, True
        if first:
            try:
                made = self._first(host, found, why, note, make)
            finally:
                self._done.set()
        while not self._done.wait(WAIT_S):
            if stopped():
                raise HostStopped()
        if self.refused is not None:
            raise HostStopped()
        if first:
            return made
        self._agree(host, found, why, note)
        return make()

    def _read(self, host) -> tuple[dict, str]:
        """What `host` answered, by model; why a model it did not answer is missing."""
        try:
            return read_on(host, self.models), "no answer"
        except HostError as exc:
            return {}, str(exc)

    def _first(self, host, found: dict, why: str, note, make):
        from stepbench.execute.elsewhere import agreed, take, unread_line

        try:
            for model in self.models:
                if model not in found:
                    note(unread_line(model, None, f"{host.host}: {why}"))
                    continue
                self.answers[model] = (host.host, found[model])
                note(take(model, *agreed(model, [self.answers[model]], self.what)))
            return make()   # the plan: a --param the factory does not take, a missing one
        except UserError as exc:
            self.refused = exc
            self.stop_all()
            return None

    def _agree(self, host, found: dict, why: str, note) -> None:
        from stepbench.execute.elsewhere import agreed

        for model, answer in self.answers.items():
            if model in found:
                agreed(model, [answer, (host.host, found[model])], self.what)
            else:
                note(f"signature of {model} not read on {host.host} ({why}); its setups' "
                     "processes check what they are given")
