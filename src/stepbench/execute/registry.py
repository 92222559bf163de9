"""The backends, by name, and the one function that picks one from the settings (`choose`).

A backend is where a command's setups run: this machine (local/), SSH hosts and rented machines
(hosts/, rent/), a Ray cluster (ray/), a Slurm partition (slurm/). Each is a `Backend` that says
whether the settings ask for it (`chosen`) and opens a `Site` for one command: the device
there, the checks that need it, and `run`: by default one Runner over the site's `Executor`
(protocol.py); SSH hosts and rentals run one per machine (hosts/site.py). The CLI (cli/run.py,
cli/tune.py) talks to these two classes only, the same way for every backend.

Adding a backend is one module (or sub-package) with a `Backend` subclass, and one `register`
call: the entries below, or a caller's (tests/test_backend_registry.py registers one from
tests/). `choose` asks the backends in order, the last registered first; the local backend,
chosen by any settings, is asked last.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from stepbench.execute.protocol import Executor

Note = Callable[[str], None]
# What the command measures with a runner: (runner, settings, plan, display) -> (records,
# searched). `run`'s is the plan, or its batch searches (search/ sits above execute/).
Measure = Callable[..., tuple[list, list]]


@dataclass
class Ran:
    """What a site's `run` did."""

    records: list = field(default_factory=list)     # the measurements to show
    searched: list = field(default_factory=list)    # every record of --max-batch's searches
    run_id: str | None = None
    failures: list[str] = field(default_factory=list)   # one line each: a host that did not finish
    lost: str | None = None     # why the executor lost its machines mid-run


class Site:
    """One command's place to run setups, opened by a backend (`Backend.open`)."""

    def device(self, settings) -> str:
        """The device the setups run on there: --device, with `auto` resolved."""
        raise NotImplementedError

    def check(self, settings, plan: list) -> None:
        """`run`'s checks of a plan that need the place (its GPUs, its memory), before any
        process starts; `settings` are resolved for `device`."""

    def executor(self, settings, plan: list, note: Note) -> Executor:
        """The executor that runs `run`'s plan there."""
        raise NotImplementedError

    runner = None       # the Runner of `run`, once it runs

    def run(self, settings, plan: list, store, display, measure: Measure) -> Ran:
        """`run`'s plan there, into `store`: one Runner over `executor`. Raises KeyboardInterrupt
        (or runner.Stopped) when a signal stops it; `kept` then has what finished."""
        from stepbench.execute.runner import Runner

        executor = self.executor(settings, plan, display.note)
        self.runner = Runner(executor, store, rerun=settings.rerun,
                             measure_peak=settings.measure_peak, run_id=executor.run_id,
                             profile=settings.profile, pin_cpus=settings.pin_cpus)
        try:
            records, searched = measure(self.runner, settings, plan, display)
        finally:
            display.close()
            executor.close()
        return Ran(records, searched, self.runner.run_id, lost=executor.lost)

    def kept(self) -> list:
        """What a stopped `run` finished (and found in the results file)."""
        return self.runner.kept() if self.runner is not None else []

    def stopped(self) -> str:
        """How a stopped `run` is told: what was stopped (the line then says what is kept)."""
        return "the running setup was stopped"

    def read_signatures(self, settings, models: list[str]) -> dict | None:
        """For a backend that `reads_signatures`: each factory of `models` (whose module is not
        importable here) read where the setups run, before any starts (execute/elsewhere.py):
        model -> (where, in words; workload/sigreader.py's fields). A model left out goes
        unchecked."""
        return None

    def check_tune(self, settings, base) -> None:
        """`tune`'s checks of its first setup `base` that need the place."""

    def tune_executor(self, settings, kinds: list, note: Note) -> Executor:
        """The executor that runs `tune`'s measurements there, one at a time (`kinds`: the
        setup of each mode tune may measure)."""
        raise NotImplementedError

    def close(self) -> None:
        """End what `open` started (a local Ray cluster)."""


class Backend:
    """One way to run setups, registered by `name`."""

    name = ""
    # Opening it contacts something (a cluster, SSH hosts): the results file is checked and the
    # progress shown before `open`, and --dry-run shows the plan without opening it (`dry_run`).
    remote = False

    def chosen(self, settings) -> bool:
        """Whether these settings (RunSettings or TuneSettings) ask for this backend."""
        raise NotImplementedError

    def require(self) -> None:
        """A UserError where what it needs is not installed (an extra)."""

    def dry_run_device(self, settings) -> tuple[str, str | None]:
        """For a remote backend's --dry-run: the device whose defaults are shown, and a line
        that says why (or None)."""
        return settings.device, None

    def dry_run(self, settings) -> int | None:
        """A remote backend's --dry-run, shown by the backend itself (every SSH host's setups):
        its exit code; None: the CLI shows the plan for `dry_run_device`."""
        return None

    def reads_signatures(self, settings) -> str | None:
        """Where its site reads a factory's signature before any setup starts (`Site.
        read_signatures`), in words ("on the SSH hosts"); None where it cannot run a command
        there before its jobs (the factory then goes unchecked: execute/elsewhere.py)."""
        return None

    def precheck(self, settings) -> None:
        """The checks that need nothing opened (a model file the nodes cannot read)."""

    def open(self, settings, note: Note) -> Site:
        raise NotImplementedError


# name -> "module:Class", imported when first asked (a backend's own imports stay unpaid until
# then); in the order asked after those registered later.
_ENTRIES: dict[str, str] = {
    "hosts": "stepbench.execute.hosts:HostsBackend",
    "ray": "stepbench.execute.ray:RayBackend",
    "slurm": "stepbench.execute.slurm:SlurmBackend",
    "local": "stepbench.execute.local.backend:LocalBackend",
}
_LOADED: dict[str, Backend] = {}
_ADDED: list[str] = []          # registered by `register`, the latest first


def register(backend: Backend) -> None:
    """Add `backend` (or replace the one of its name); it is asked before those registered
    earlier."""
    _LOADED[backend.name] = backend
    _ENTRIES.pop(backend.name, None)
    if backend.name in _ADDED:
        _ADDED.remove(backend.name)
    _ADDED.insert(0, backend.name)


def unregister(name: str) -> None:
    """Remove a backend that `register` added."""
    _LOADED.pop(name, None)
    if name in _ADDED:
        _ADDED.remove(name)


def names() -> list[str]:
    """The backends, in the order `choose` asks them."""
    return _ADDED + [n for n in _ENTRIES if n not in _ADDED]


def get(name: str) -> Backend:
    if name not in _LOADED:
        module, _, attr = _ENTRIES[name].partition(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)()
    return _LOADED[name]


def choose(settings) -> Backend:
    """The backend these settings ask for: the first, in `names()` order, that is `chosen`."""
    for name in names():
        backend = get(name)
        if backend.chosen(settings):
            return backend
    raise LookupError("no backend takes these settings")    # the local one takes any
