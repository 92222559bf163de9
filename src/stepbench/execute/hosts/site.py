"""The SSH hosts' site (registry.Site): every host and rented machine runs the plan at once, each
with its own runner (fleet.py), into one results file; the rented machines are prepared when the
site opens (rent/rentals.py: prices, the API key and the SSH key checked before any is created)
and their cost is said when the run ends."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from stepbench.execute.registry import Measure, Note, Ran, Site


def say(text: str) -> None:
    print(f"stepbench run: {text}", file=sys.stderr)


def plan_device(settings) -> str:
    """The device of the plan checked here: each host resolves `auto` to its own, so `auto` is
    checked as the CPU's."""
    return "cpu" if settings.device == "auto" else settings.device


class HostsSite(Site):
    def __init__(self, settings, specs: list, rentals=None, loop=None):
        # As given: each host resolves --device auto to its own device, and its model defaults
        # with it (the settings `run` gets are resolved for this machine's check only).
        self.asked = settings
        self.specs = specs
        self.rentals, self.loop = rentals, loop
        self.runs: list = []            # fleet.HostRun per machine, as each starts
        self.later: list[str] = []      # factories read on the first rented machine prepared
        self.known: dict = {}           # model -> (SSH host, fields): each rented machine agrees
        self.costed = False

    @classmethod
    def open(cls, settings, note: Note) -> "HostsSite":
        from stepbench.execute.hosts.ssh import parse_host

        specs = [parse_host(name) for name in settings.remote.hosts]    # checked by precheck
        if not settings.rent.specs:
            return cls(settings, specs)
        from stepbench.execute.hosts.ssh import EventLoop
        from stepbench.execute.rent.rentals import prepare_rentals

        loop = EventLoop()
        try:
            return cls(settings, specs, prepare_rentals(settings.rent, loop, note), loop)
        except BaseException:
            loop.close()
            raise

    def device(self, settings) -> str:
        return plan_device(settings)

    def read_signatures(self, settings, models: list[str]) -> dict:
        """Each factory read on every SSH host that answers (execute/elsewhere.py), all at
        once before the run starts on any; they must agree. A host that does not answer is
        left to the run, which says why. Rented machines alone: read on the first one prepared,
        before any setup's job (fleet.py, firstread.py); each rented machine reads them too, and
        must agree."""
        from stepbench.execute.elsewhere import LATER, agreed
        from stepbench.execute.hosts.firstread import read_on
        from stepbench.execute.hosts.ssh import EventLoop, HostError, SSHExecutor

        if not self.specs:
            self.later = list(models)
            return dict.fromkeys(models, LATER)

        def read(spec) -> dict:
            host = SSHExecutor(spec, loop, self.asked.remote)
            try:
                host.connect()
                return read_on(host, models)
            except HostError:
                return {}
            finally:
                host.close()

        loop = EventLoop()
        try:       # every host at once: one that does not answer costs its timeout once
            with ThreadPoolExecutor(len(self.specs)) as pool:
                read_by_host = list(pool.map(read, self.specs))
        finally:
            loop.close()
        answers = {model: [(spec.name, found[model])
                           for spec, found in zip(self.specs, read_by_host) if model in found]
                   for model in models}
        self.known = {model: found[0] for model, found in answers.items() if found}
        return {model: agreed(model, found) for model, found in answers.items() if found}

    def run(self, settings, plan: list, store, display, measure: Measure) -> Ran:
        from stepbench.execute.hosts.fleet import run_on_hosts

        loop, self.loop = self.loop, None      # run_on_hosts closes it
        run_on_hosts(self.asked, self.specs, display, store, measure, self.rentals, loop,
                     self.runs, self.later, self.known)
        display.close()
        self._say_cost()
        records = [record for run in self.runs for record in run.records]
        failures = [f"host {run.name}: {run.failure}" for run in self.runs if run.failure]
        return Ran(records, [], self.runs[0].run_id if self.runs else None, failures)

    def kept(self) -> list:
        return [record for run in self.runs for record in run.kept()]

    def stopped(self) -> str:
        kept = [lease for lease in self.rentals.leases if lease.delete_failed] \
            if self.rentals else []
        for lease in kept:
            say(f"host {lease.name}: {lease.delete_failed}")
        deleted = "; every rented machine was deleted" if self.rentals and not kept else ""
        return f"the running setups were stopped on every host{deleted}"

    def _say_cost(self) -> None:
        if self.rentals and not self.costed:
            from stepbench.execute.rent.rentals import cost_summary

            self.costed = True
            summary = cost_summary(self.rentals.leases)
            if summary:
                say(summary)

    def close(self) -> None:
        if self.loop is not None:       # opened, never run
            self.loop.close()
        if self.rentals:
            self._say_cost()
            self.rentals.close()
