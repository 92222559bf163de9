"""A factory's signature read over a host's own SSH connection (execute/elsewhere.py): on each SSH
host before the run (site.py), and, for rented machines that do not exist before the run, on the
first one prepared (`FirstRead`), before any setup's job is sent to any of them.

Each rented machine's thread (fleet.py) calls `FirstRead.before_plan` once its machine is
prepared, to make its plan: the first reads the factories there with workload/sigreader.py (the
machine's Python and --remote-setup, as its setups' processes see their packages) and makes its
plan with what was read, the others wait for it. A read that
refuses the factory (a --param it does not take, a module the machine lacks) stops every host and
rented machine; the run then deletes them and raises the refusal (one line, exit 2)."""

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
    """The factories a run of rented machines reads on the first one prepared."""

    def __init__(self, models: list[str], stop_all: Callable[[], None]):
        self.models, self.stop_all = list(models), stop_all
        self.refused: UserError | None = None       # the one line the run ends with
        self._claimed = False
        self._lock = threading.Lock()
        self._done = threading.Event()

    def before_plan(self, host, note: Callable[[str], None], stopped: Callable[[], bool],
                    make: Callable[[], Plan]) -> Plan:
        """In a machine's thread, once it is prepared: its plan, `make` (which checks it). The
        first machine reads there and makes its plan with what was read (a refusal stops every
        machine); the others wait for that, then make theirs. Raises HostStopped where the run
        stops."""
        if not self.models:
            return make()
        with self._lock:
            first, self._claimed = not self._claimed, True
        if first:
            try:
                made = self._read(host, note, make)
            finally:
                self._done.set()
        while not self._done.wait(WAIT_S):
            if stopped():
                raise HostStopped()
        if self.refused is not None:
            raise HostStopped()
        return made if first else make()

    def _read(self, host, note, make):
        from stepbench.execute.elsewhere import agreed, take, unread_line

        try:
            found = read_on(host, self.models)
        except HostError as exc:
            found = {}
            why = str(exc)
        else:
            why = "no answer"
        try:
            for model in self.models:
                if model not in found:
                    note(unread_line(model, None, f"{host.host}: {why}"))
                    continue
                note(take(model, *agreed(model, [(host.host, found[model])], "rented machine")))
            return make()   # the plan: a --param the factory does not take, a missing one
        except UserError as exc:
            self.refused = exc
            self.stop_all()
            return None
