"""`stepbench run --host A --host B ...`: the same matrix on every host at once, into one file.

Each host gets its own thread, SSH executor (execute/hosts/ssh.py) and Runner, so resume, records,
timeouts and progress are the local run's: the runner keys and tags every record with the host's
name, and two hosts with the same GPU never stand in for each other. Device and model defaults
are worked out on each host (a GPU host runs the GPU defaults, a CPU host the CPU ones). A host
that cannot be reached, refuses the key, fails to prepare or is lost mid-run ends in one line on
stderr; the others go on. Ctrl-C, SIGTERM and SIGHUP stop every host's running setup; what
finished is in the file. A rented machine (`--rent`, execute/rent/rentals.py) is one more host: its
thread creates it first, points the host's executor at it, and deletes it last, every way out.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from stepbench.errors import UserError
from stepbench.record import Record, ResultsFile
from stepbench.settings import RunSettings

@dataclass
class HostRun:
    """What happened on one host."""

    name: str
    records: list[Record] = field(default_factory=list)
    failure: str | None = None          # the host's one line, when it could not finish
    runner: object = field(default=None, repr=False)    # its Runner, once the plan runs there
    run_id: str | None = None           # the run's id: its records made now carry it

    def kept(self) -> list[Record]:
        """What the host finished so far (its records once it is done, or stopped)."""
        return self.runner.kept() if self.runner is not None else list(self.records)


def model_copies(model: str | None) -> list[dict]:
    """A --model config file (or folder) to copy to every host: its text, keyed by its hash."""
    if model is None:
        return []
    path = Path(model)
    if not path.exists():
        return []               # a preset: every host has it
    config = path / "config.json" if path.is_dir() else path
    text = config.read_text()
    return [{"local": model, "sha": hashlib.sha256(text.encode()).hexdigest()[:16], "text": text}]


def check_hosts(settings: RunSettings) -> list:
    """The hosts the settings name, as HostSpecs; a UserError for a bad one or a missing
    asyncssh, before anything else is done."""
    from stepbench.execute.hosts.ssh import parse_host, require_asyncssh

    from stepbench.execute.bundle import carried

    specs = [parse_host(name) for name in settings.remote.hosts]
    require_asyncssh()
    carried(settings, destination(settings))     # a factory file that cannot travel: refused now
    return specs


def destination(settings: RunSettings) -> str:
    """The machines a host run's factory files travel to, in words (bundle.carried's `what`)."""
    return "rented machines" if settings.rent.specs and not settings.remote.hosts \
        else "SSH hosts"


def planned(settings: RunSettings, device: str) -> tuple[RunSettings, list]:
    """The settings on a host's device and their plan, its models checked."""
    from stepbench.measure.models import check_models

    there = settings.resolved(device)
    there.check_device()        # --device auto: known now (resolved leaves it to the host)
    plan = there.plan()
    check_models(plan)
    return there, plan


def run_on_hosts(settings: RunSettings, specs: list, display, store: ResultsFile, measure,
                 rentals=None, loop=None, runs: list[HostRun] | None = None,
                 later: list[str] = (), known: dict | None = None) -> list[HostRun]:
    """Run the plan on every host (`specs`, from check_hosts) and every rented machine
    (`rentals`, execute/rent/rentals.py: each is created, run and deleted in its host's thread); returns
    what each host did, in the order named (appended to `runs` as they start, so that a caller
    stopped by Ctrl-C sees what each host finished: HostRun.kept); `measure` (registry.Measure)
    runs each host's plan with its runner. Raises KeyboardInterrupt (or
    runner.Stopped) after stopping every host; a rented machine is deleted before this returns
    or raises. `later`: the factories read on the first rented machine prepared, before any
    setup's job on any (firstread.py); a UserError, raised once every machine is deleted, where
    that read refuses one. `known`: those read on the SSH hosts, model -> (host, fields). Each
    rented machine reads them too, before its setups: one that disagrees fails, in one line."""
    from stepbench.execute import bundle
    from stepbench.execute.bundle import carried
    from stepbench.execute.progress import HostView
    from stepbench.execute.runner import Runner, least_processes, new_run_id, stop_signals
    from stepbench.execute.hosts.firstread import FirstRead
    from stepbench.execute.hosts.ssh import EventLoop, HostError, HostSpec, HostStopped, SSHExecutor
    from stepbench.execute.local import uses_server
    from stepbench.execute.local.server import imports_for

    options = settings.remote
    models = model_copies(settings.values["model"])
    workload = carried(settings, destination(settings))
    wheel = bundle.build()
    run_id = new_run_id()
    loop = loop or EventLoop()
    leases = list(rentals.leases) if rentals else []
    hosts = [SSHExecutor(spec, loop, options) for spec in specs]
    # A rented machine's address is known once it runs: its executor is pointed there then.
    hosts += [SSHExecutor(HostSpec(lease.name, lease.name), loop, options) for lease in leases]
    runs = runs if runs is not None else []
    runs.extend(HostRun(host.host, run_id=run_id) for host in hosts)
    lease_of = {lease.name: lease for lease in leases}

    def stop_all() -> None:
        for host in hosts:
            host.stop()
        if rentals:
            rentals.stop()

    first_read = FirstRead(later, stop_all, known)

    def one(host: SSHExecutor, result: HostRun) -> None:
        view = HostView(display, host.host)
        lease = lease_of.get(host.host)
        try:
            if lease is not None:
                spec, ssh_config, host.rental = lease.acquire(view.note)
                host.spec, host.options = spec, dataclasses.replace(options, ssh_config=ssh_config)
            view.note("connecting")
            host.connect()
            view.note("preparing (installs stepbench there once per version)")
            info = host.prepare(wheel, models, settings.device, settings.compile_cache,
                                workload)
            probe = info["probe"]
            device = probe["device"]
            where = "the CPU" if device == "cpu" else probe["gpu"]
            view.note(f"runs on {where}, torch {probe['software'].get('torch')}"
                      + (f" (installed stepbench into {info['env']})" if info["installed"] else ""))
            if workload is not None:
                view.note(f"{workload.describe()}, its setups run in {info['workload_cwd']}")
            if lease is None:           # an SSH host: read before the run (site.py)
                there, plan = planned(settings, device)
            else:
                there, plan = first_read.before_plan(host, view.note, lease.stopping.is_set,
                                                     functools.partial(planned, settings, device))
            if uses_server(there.start):
                view.note(host.start_server(imports_for(plan)))
            runner = Runner(host, store, rerun=there.rerun, measure_peak=there.measure_peak,
                            run_id=run_id, pin_cpus=there.pin_cpus)
            result.runner = runner
            result.records, _ = measure(runner, there, plan, view)
            if host.lost:
                missing = len(plan) * least_processes(there.repeats) - len(result.records)
                result.failure = (f"{host.lost}; {missing} setup{'s' if missing != 1 else ''} "
                                  "not run; run the same command again to resume")
        except (HostError, UserError) as exc:
            result.failure = str(exc)
        except HostStopped:
            pass
        finally:
            view.close()
            if lease is not None:
                host.close()
                release(lease, view, result)

    def release(lease, view, result: HostRun) -> None:
        problem = lease.release()
        if problem:
            result.failure = f"{result.failure}; {problem}" if result.failure else problem
        elif lease.instance is not None:
            cost = lease.cost
            view.note(f"deleted instance {lease.instance.id} (rented {lease.minutes:.1f} min"
                      + (f", about ${cost:.2f}" if cost is not None else "") + ")")

    pool = ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="stepbench-host")
    try:
        with stop_signals():
            futures = [pool.submit(one, host, result) for host, result in zip(hosts, runs)]
            try:
                wait(futures)
            except BaseException:
                stop_all()
                with _holding(leases):
                    wait(futures)
                raise
            for future in futures:
                future.result()     # a bug in a host's thread surfaces here, with its traceback
    finally:
        with _holding(leases):
            pool.shutdown(wait=True)
            closers = [threading.Thread(target=host.close) for host in hosts]
            for closer in closers:
                closer.start()
            for closer in closers:
                closer.join()
            if rentals:
                # Each host's thread deleted its machine; this catches a thread that never ran.
                for name, problem in rentals.release_all():
                    run = next(r for r in runs if r.name == name)
                    if problem not in (run.failure or ""):
                        run.failure = f"{run.failure}; {problem}" if run.failure else problem
        loop.close()
    if first_read.refused is not None:
        raise first_read.refused
    return runs


def _holding(leases):
    """While rented machines are deleted, a signal does not cut that short."""
    from contextlib import nullcontext

    from stepbench.execute.rent.rentals import hold_signals

    if not leases:
        return nullcontext()
    return hold_signals("deleting the rented machines first; this takes a few seconds")


