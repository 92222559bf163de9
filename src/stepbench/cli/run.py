"""`stepbench run`: the matrix of setups, each in its own process, on this machine, on SSH hosts
or on rented machines; with --max-batch, the largest batch of each that fits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stepbench.cli.base import EXIT_OK, outcome, report_hint, say, stopped
from stepbench.cli.flags import add_axis_flags, add_settings
from stepbench.settings import DEFAULT_OUT, RUN, RunSettings

def add(sub, settings: type = RunSettings) -> None:
    """`run`'s parser: --plan, a flag per axis, a flag per setting `settings` declares."""
    p = sub.add_parser(
        "run", help="run the matrix of setups, each in its own process",
        description="Run each setup (mode x attention x precision x ... x batch x seq) in its own "
                    "process and record step time, tokens/s, peak memory and first-step (compile) "
                    "time. Axis flags take comma lists; every combination runs.")
    p.add_argument("--plan", type=Path, metavar="FILE",
                   help="a TOML plan of the matrix (docs/cli.md, 'Plan files'); flags given "
                        "beside it override its values")
    add_axis_flags(p, RUN)
    add_settings(p, settings)
    p.set_defaults(handler=cmd_run)


def settings_of(args) -> RunSettings:
    """The run's settings: defaults, then the plan file's values, then the flags given."""
    from stepbench.cli.base import given
    from stepbench.plan import read_plan

    flags = given(args)
    plan = flags.pop("plan", None)
    return RunSettings.build(flags, read_plan(plan) if plan is not None else None)


def cmd_run(args) -> int:
    from stepbench.execute.registry import choose

    settings = settings_of(args)
    backend = choose(settings)
    if backend.fleet:
        return run_hosts(settings)
    return run_on(backend, settings)


def run_on(backend, settings: RunSettings) -> int:
    """The plan through the backend's one executor (execute/registry.py): this machine, or a
    cluster (each setup a job of it). A remote backend is contacted only after the checks that
    need nothing (and never for --dry-run), and with the results file known to be writable."""
    from stepbench.execute.progress import Display
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile
    from stepbench.search.max_batch import check_searches

    backend.require()
    if settings.dry_run and backend.remote:     # nothing is contacted, nothing started
        shown, why = backend.dry_run_device(settings)
        local = settings.resolved(shown)
        if why:
            say("run", why)
        print_plan(local.plan(), local.format) if local.max_batch is None else \
            print_searches(local.plan(), local)
        return 0
    backend.precheck(settings)
    store = display = site = None
    if backend.remote:
        store = ResultsFile(settings.out).check_writable()
        display = Display()
    try:
        site = backend.open(settings, display.note if display else lambda text: say("run", text))
        local = settings.resolved(site.device(settings))
        plan = local.plan()
        with local.origin.checking("model"):    # a plan's model: the error names the plan
            check_models(plan)
        if local.max_batch is not None:
            check_searches(local.max_batch, plan, local.origin)
        if local.dry_run:
            print_plan(plan, local.format) if local.max_batch is None else \
                print_searches(plan, local)
            return 0
        site.check(local, plan)
        if store is None:
            store = ResultsFile(local.out).check_writable()
            display = Display()
        executor = site.executor(local, plan, display.note)
        code = run_plan(local, plan, executor, store, display)
        if executor.lost and code == 0:
            say("run", f"{executor.lost}; the setups it did not run are not recorded; run the "
                       "same command again to resume")
            return 1
        return code
    finally:
        if display is not None:
            display.close()
        if site is not None:
            site.close()


def run_plan(local: RunSettings, plan, executor, store, display) -> int:
    """The plan (or its batch searches) through one executor into `store`; the records printed.
    Closes the display and the executor."""
    from stepbench.execute.runner import Runner
    from stepbench.search.max_batch import MaxBatch

    runner = Runner(executor, store, rerun=local.rerun, measure_peak=local.measure_peak,
                    run_id=executor.run_id, profile=local.profile, pin_cpus=local.pin_cpus)
    searched = []
    try:
        if local.max_batch is None:
            records = runner.run(plan, repeats=local.repeats, timeout_s=local.timeout_s,
                                 display=display)
        else:
            found = MaxBatch(runner, local.max_batch, repeats=local.repeats,
                             timeout_s=local.timeout_s, display=display).run(plan)
            records = [r for s in found for r in s.finals]
            searched = [p.record for s in found for p in s.probes] + records
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        display.close()
        print_stopped(local, runner.kept())
        return stopped("run", exc, f"the running setup was stopped, finished setups are kept "
                                   f"in {local.out}")
    finally:
        display.close()
        executor.close()
    print_records(local, records, searched)
    # A search that found no batch to fit has no finals: its probes say how the run ended.
    return outcome("run", records or searched, runner.run_id, local.out)


def print_stopped(settings: RunSettings, kept: list) -> None:
    """A stopped run's table (or JSON array) on stdout: the setups that finished (and those
    found in the results file), as the run would have shown them; with --max-batch, the full
    measurements in the table and every probe under its details."""
    if not kept and settings.format != "json":
        return
    if settings.max_batch is None:
        print_records(settings, kept, hints=False)
        return
    finals = [r for r in kept if (r.search or {}).get("role") == "final"]
    print_records(settings, finals, kept, hints=False)


def run_hosts(settings: RunSettings) -> int:
    """`run --host ... --rent ...`: the plan on every host and rented machine at once
    (execute/fleet.py, execute/rent.py)."""
    from stepbench.execute.hosts.fleet import check_hosts, report_failures, run_on_hosts
    from stepbench.execute.progress import Display
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile

    # The flags are checked here, once, before any host is contacted.
    specs = check_hosts(settings)
    # Each host checks its own plan too, once its device is known.
    with settings.origin.checking("model"):
        resolved = settings.resolved("cpu" if settings.device == "auto" else settings.device)
        check_models(resolved.plan())
    if settings.dry_run:
        return dry_run_hosts(settings, specs)
    store = ResultsFile(settings.out).check_writable()
    display = Display()
    rentals = loop = None
    if settings.rent.specs:
        from stepbench.execute.rent.rentals import prepare_rentals
        from stepbench.execute.hosts.ssh import EventLoop

        loop = EventLoop()
        try:
            # Prices, the API key and the SSH key are checked before any machine is created.
            rentals = prepare_rentals(settings.rent, loop, display.note)
        except BaseException:
            loop.close()
            raise
    runs = []
    try:
        run_on_hosts(settings, specs, display, store, rentals, loop, runs)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        display.close()
        print_stopped(settings, [record for run in runs for record in run.kept()])
        kept = [lease for lease in rentals.leases if lease.delete_failed] if rentals else []
        for lease in kept:
            say("run", f"host {lease.name}: {lease.delete_failed}")
        deleted = "; every rented machine was deleted" if rentals and not kept else ""
        return stopped("run", exc, f"the running setups were stopped on every host{deleted}, "
                                   f"finished setups are kept in {settings.out}")
    finally:
        display.close()
        if rentals:
            from stepbench.execute.rent.rentals import cost_summary

            summary = cost_summary(rentals.leases)
            if summary:
                say("run", summary)
            rentals.close()
    records = [record for run in runs for record in run.records]
    if records or settings.format == "json":
        print_records(settings, records)
    failed = report_failures(runs)
    ran = outcome("run", records, runs[0].run_id, settings.out) if runs else EXIT_OK
    return failed or ran


def dry_run_hosts(settings: RunSettings, specs: list) -> int:
    """`run --host/--rent --dry-run`: the setups each SSH host and each rented machine would
    run, after the checks that need no other machine; nothing is contacted (--rent-prices asks
    the providers for each rental's machine and price)."""
    from stepbench.execute.rent.rentals import API_KEYS, check_rentals, quote_rentals

    rentals, key = check_rentals(settings.rent) if settings.rent.specs else ([], None)
    offers = quote_rentals(rentals) if settings.rent.prices else {}
    auto = settings.device == "auto"
    # Whose defaults each machine's setups show: a host's device is known once it is probed
    # there (a GPU host's are shown), a rented machine has GPUs.
    shown = "cuda" if auto else settings.device
    common = {"device": settings.device, "defaults_of": shown,
              "setups": settings.resolved(shown).plan()}
    machines = [{"host": spec.name, "via": "ssh", "address": spec.host, "user": spec.user,
                 "port": spec.port, **common} for spec in specs]
    for spec in rentals:
        offer = offers.get(spec.name)
        machines.append({"host": spec.name, "via": "rent", "provider": spec.provider,
                         "gpu_type": spec.gpu_type, "gpu_count": spec.gpu_count,
                         "price_per_hour": offer.price_per_hour if offer else None,
                         "region": offer.region if offer else None, **common})
    if settings.format == "json":
        print(json.dumps([{**m, "setups": [s.to_dict() for s in m["setups"]]} for m in machines],
                         indent=1))
    else:
        for m in machines:
            print(f"{_machine_line(m)}: {len(m['setups'])} setups")
            for setup in m["setups"]:
                print("  " + _setup_line(setup))
    if auto and specs:
        cpu = [_workload(s) for s in settings.resolved("cpu").plan()]
        differs = cpu != [_workload(s) for s in common["setups"]]
        say("run", "each machine runs the defaults of its own device; shown: a GPU's"
                   + (" (a host without one runs the CPU's: --device cpu --dry-run lists them)"
                      if differs else ""))
    checked = []
    if specs:
        checked += ["the host names"] + [f"{what} {path}" for what, path in (
            ("the hosts file", settings.remote.hosts_file),
            ("the SSH config file", settings.remote.ssh_config)) if path]
    if rentals:
        checked += ["the rentals and their providers", f"the SSH key {key}"]
    if offers:
        checked += ["the providers' GPU types and prices now"]
    unchecked = []
    if specs:
        unchecked.append("that the hosts answer (their SSH config entries, keys and host keys) "
                         "and what GPU and Python they have")
    if rentals and not offers:
        names = sorted({s.provider for s in rentals})
        unchecked.append(f"{' and '.join(names)}'s GPU types, counts and prices now, and "
                         + " and ".join(API_KEYS.get(n, f"{n}'s API key") for n in names)
                         + " (--rent-prices asks, creating nothing)")
    elif rentals:
        unchecked.append("that the machines will be there when the run asks for them")
    say("run", f"dry run: checked {', '.join(checked)}; contacted "
               f"{'only the providers' if offers else 'nothing'}; not checked: "
               + "; ".join(unchecked))
    return 0


def _machine_line(m: dict) -> str:
    """'host alpha (SSH; a GPU's defaults)', 'rented runcrate:L40S (1 x L40S from runcrate at
    $0.86/h; --device cuda)'."""
    device = ("a GPU's defaults" if m["device"] == "auto" and m["via"] == "ssh"
              else f"--device {m['device']}" if m["device"] != "auto" else "")
    if m["via"] == "ssh":
        return f"host {m['host']} (SSH; {device})"
    price = (f" at ${m['price_per_hour']:g}/h" + (f" ({m['region']})" if m["region"] else "")
             if m["price_per_hour"] is not None else "")
    return (f"rented {m['host']} ({m['gpu_count']} x {m['gpu_type']} from {m['provider']}"
            f"{price}{'; ' + device if device else ''})")


def _workload(setup) -> tuple:
    return setup.name, setup.batch, setup.seq, setup.dtype, setup.model


def _setup_line(setup) -> str:
    return (f"{setup.name}  batch {setup.shape}  {setup.dtype}  {setup.model_label}  "
            + (f"{setup.params}  " if setup.params else "")
            + (f"{setup.parallel_label}  " if setup.distributed else "") + setup.device)


def print_records(settings: RunSettings, records, searched=(), hints: bool = True) -> None:
    """The run's records on stdout: a table (repeats combined) or the JSON array. `searched`:
    every record of `--max-batch`'s searches (for its details table), `records` their full
    measurements. `hints`: then, on stderr, where the results are and the command that reports
    them."""
    if settings.format == "json":
        print(json.dumps([r.to_dict() for r in records], indent=1), flush=True)
    else:
        from stepbench.report.document import run_document
        from stepbench.report.render import render

        print(render(run_document(records, searched), settings.format), end="", flush=True)
    if hints:
        report_hint(settings.out)


def print_plan(plan, fmt: str) -> None:
    """--dry-run: the setups, one a line (or their `setup` objects as JSON), nothing run."""
    if fmt == "json":
        print(json.dumps([s.to_dict() for s in plan], indent=1))
        return
    for setup in plan:
        print(_setup_line(setup))
    print(f"{len(plan)} setups", file=sys.stderr)


def print_searches(plan, settings: RunSettings) -> None:
    """--dry-run --max-batch: the searches, one a line (or as JSON objects), nothing run."""
    from stepbench.search.max_batch import describe, describe_line

    items = describe(plan, settings.max_batch, settings.repeats)
    if settings.format == "json":
        print(json.dumps(items, indent=1))
        return
    for item in items:
        print(describe_line(item))
    print(f"{len(items)} searches", file=sys.stderr)


__all__ = ["add", "cmd_run", "DEFAULT_OUT"]
