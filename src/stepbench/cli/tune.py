"""`stepbench tune`: the fastest setup of one model on this machine within a time budget."""

from __future__ import annotations

import math
import sys

from stepbench.cli.base import given, report_hint, say, stopped
from stepbench.cli.flags import add_axis_flags, add_settings
from stepbench.report.jsontext import strict
from stepbench.settings import TUNE, TuneSettings


def add(sub, settings: type = TuneSettings) -> None:
    p = sub.add_parser(
        "tune", help="search the axes for the fastest setup of a model within a time budget",
        description="Search for the fastest setup of one model on this machine within a time "
                    "budget: eager mode at doubling batches first (the loss guard's reference "
                    "and the batch where throughput saturates), then torch.compile with each "
                    "attention kernel there, then one change at a time, chosen by what it may "
                    "gain per second it costs, then more processes of the best two. Every "
                    "measurement is a record in --out: a tune resumes, and `stepbench report` "
                    "shows it. Axis flags narrow the search to their values (docs/tune.md).")
    add_axis_flags(p, TUNE)
    add_settings(p, settings)
    p.set_defaults(handler=cmd_tune)


def cmd_tune(args) -> int:
    from stepbench.execute.elsewhere import factories
    from stepbench.execute.registry import choose

    settings = TuneSettings.build(given(args))
    backend = choose(settings)
    backend.require()
    # A package importable where the setups run, not here (execute/elsewhere.py).
    with factories(backend, settings, lambda text: say("tune", text)) as away:
        backend.precheck(settings)
        site = backend.open(settings, lambda text: say("tune", text))
        try:
            away.read(settings, site)
            return _tune(settings, site)
        finally:
            site.close()


def _tune(settings: TuneSettings, site) -> int:
    from stepbench.errors import UserError
    from stepbench.execute.progress import Display
    from stepbench.execute.runner import Runner
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile
    from stepbench.search import tune

    settings = settings.resolved(site.device(settings))
    space, skipped = tune.space_for(settings)
    base = tune.start(settings, space)
    check_models([base])
    store = ResultsFile(settings.out)
    kinds = [base.replace(mode=m) for m in space["mode"]]
    site.check_tune(settings, base)
    display = Display()
    executor = site.tune_executor(settings, kinds, display.note)
    runner = Runner(executor, store, run_id=executor.run_id, pin_cpus=settings.pin_cpus)
    try:
        tuner = tune.Tuner(runner, base, space, budget_s=settings.budget_s,
                           objective=settings.objective, timeout_s=settings.timeout_s,
                           repeats=settings.repeats, skipped=skipped, start=settings.start,
                           display=display,
                           say=lambda text: display.line(f"stepbench tune: {text}"))
        first = tuner.first_price()
        if first is not None and settings.budget_s < first.total:
            raise UserError(f"--budget {settings.budget_s:g}s is less than the tune's first "
                            f"measurement here: {tune.label(tuner.reference_setup(base.batch))} "
                            f"takes at least {first.total:.0f} s ({first.describe()}); give "
                            f"--budget {math.ceil(first.total)}s or more")
        store.check_writable()
    except BaseException:       # bad input found here (a results file that is a folder, ...)
        executor.close()
        display.close()
        raise
    try:
        result = tuner.run()
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        display.close()
        so_far = tuner.so_far()
        if so_far.tried or settings.format == "json":
            print_result(so_far, settings.format)
        return stopped("tune", exc, f"what it measured is kept in {settings.out}")
    finally:
        display.close()
        executor.close()
    print_result(result, settings.format)
    sys.stdout.flush()
    report_hint(settings.out)
    return 0 if result.winner is not None else 1


def print_result(result, fmt: str) -> None:
    """json: the TuneResult object (a documented output); every other format: the tune's
    Document (its table and verdict), rendered as the report renders one."""
    if fmt == "json":
        print(strict(result.to_dict(), indent=1, default=str))
        return
    from stepbench.report.render import render
    from stepbench.report.tune import tune_document

    sys.stdout.write(render(tune_document(result), fmt))


__all__ = ["add", "cmd_tune", "print_result", "say"]
