"""`stepbench run`: the matrix of setups, each in its own process, on this machine, on SSH hosts,
rented machines or a cluster, every backend through its site (execute/registry.py); with
--max-batch, the largest batch of each that fits."""

from __future__ import annotations

import sys
from pathlib import Path

from stepbench.cli.base import EXIT_FAILED, EXIT_OK, outcome, report_hint, say, stopped
from stepbench.cli.flags import add_axis_flags, add_settings
from stepbench.report.jsontext import strict
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
    return run_on(choose(settings), settings)


def run_on(backend, settings: RunSettings) -> int:
    """The plan through the backend's site (execute/registry.py): this machine, a cluster (each
    setup a job of it), or SSH hosts and rented machines (a runner each). A remote backend is
    contacted only after the checks that need nothing (and never for --dry-run), and with the
    results file known to be writable."""
    from stepbench.execute.elsewhere import factories

    backend.require()
    # A package importable where the setups run, not here: its signature is read there.
    with factories(backend, settings, lambda text: say("run", text)) as away:
        return _run_on(backend, settings, away)


def _run_on(backend, settings: RunSettings, away) -> int:
    from stepbench.execute.progress import Display
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile
    from stepbench.search.max_batch import check_searches

    if settings.dry_run and backend.remote:     # nothing is contacted, nothing started
        away.dry_run()
        shown = backend.dry_run(settings)
        if shown is not None:
            return shown
        backend.precheck(settings)      # what needs no cluster: a factory that cannot travel
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
        away.read(settings, site)
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
        return run_plan(local, plan, site, store, display)
    finally:
        if display is not None:
            display.close()
        if site is not None:
            site.close()


def run_plan(local: RunSettings, plan, site, store, display) -> int:
    """The plan (or its batch searches) through the site into `store`; the records printed, a
    line for each machine that did not finish; the exit code."""
    try:
        ran = site.run(local, plan, store, display, measure)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        display.close()
        print_stopped(local, site.kept())
        return stopped("run", exc, f"{site.stopped()}, finished setups are kept in {local.out}")
    finally:
        display.close()
    # Machines that failed and left nothing: no empty table.
    if ran.records or ran.searched or local.format == "json" or not ran.failures:
        print_records(local, ran.records, ran.searched)
    for line in ran.failures:
        say("run", line)
    # A search that found no batch to fit has no finals: its probes say how the run ended.
    code = (outcome("run", ran.records or ran.searched, ran.run_id, local.out)
            if ran.run_id is not None else EXIT_OK)
    if ran.failures:
        return EXIT_FAILED
    if ran.lost and code == 0:
        say("run", f"{ran.lost}; the setups it did not run are not recorded; run the same "
                   "command again to resume")
        return EXIT_FAILED
    return code


def measure(runner, local: RunSettings, plan, display) -> tuple[list, list]:
    """What `run` measures with a runner (one per machine): the plan, or with --max-batch its
    batch searches: (the records to show, every record of the searches)."""
    from stepbench.search.max_batch import MaxBatch

    if local.max_batch is None:
        return runner.run(plan, repeats=local.repeats, timeout_s=local.timeout_s,
                          display=display), []
    found = MaxBatch(runner, local.max_batch, repeats=local.repeats,
                     timeout_s=local.timeout_s, display=display).run(plan)
    records = [r for s in found for r in s.finals]
    return records, [p.record for s in found for p in s.probes] + records


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


def print_records(settings: RunSettings, records, searched=(), hints: bool = True) -> None:
    """The run's records on stdout: a table (repeats combined) or the JSON array. `searched`:
    every record of `--max-batch`'s searches (for its details table), `records` their full
    measurements. `hints`: then, on stderr, where the results are and the command that reports
    them."""
    if settings.format == "json":
        print(strict([r.to_dict() for r in records], indent=1), flush=True)
    else:
        from stepbench.report.document import run_document
        from stepbench.report.render import render

        print(render(run_document(records, searched), settings.format), end="", flush=True)
    if hints:
        report_hint(settings.out)


def print_plan(plan, fmt: str) -> None:
    """--dry-run: the setups, one a line (or their `setup` objects as JSON), nothing run."""
    from stepbench.setup import setup_line

    if fmt == "json":
        print(strict([s.to_dict() for s in plan], indent=1))
        return
    for setup in plan:
        print(setup_line(setup))
    print(f"{len(plan)} setup{'s' if len(plan) != 1 else ''}", file=sys.stderr)


def print_searches(plan, settings: RunSettings) -> None:
    """--dry-run --max-batch: the searches, one a line (or as JSON objects), nothing run."""
    from stepbench.search.max_batch import describe, describe_line

    items = describe(plan, settings.max_batch, settings.repeats)
    if settings.format == "json":
        print(strict(items, indent=1))
        return
    for item in items:
        print(describe_line(item))
    print(f"{len(items)} searches", file=sys.stderr)


__all__ = ["add", "cmd_run", "DEFAULT_OUT"]
