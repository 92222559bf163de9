"""`stepbench run`: the matrix of setups, each in its own process, on this machine, on SSH hosts
or on rented machines; with --max-batch, the largest batch of each that fits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stepbench.cli.base import EXIT_OK, outcome, report_hint, say, stopped
from stepbench.cli.flags import (add_axis_flags, add_option, add_options, add_cluster_options,
                                 option_keys)
from stepbench.errors import UserError
from stepbench.settings import (DEFAULT_OUT, MAX_BATCH_KEYS, CLUSTER_KEYS, RUN, RunSettings,
                                writable_folder)

def add(sub) -> None:
    p = sub.add_parser(
        "run", help="run the matrix of setups, each in its own process",
        description="Run each setup (mode x attention x precision x ... x batch x seq) in its own "
                    "process and record step time, tokens/s, peak memory and first-step (compile) "
                    "time. Axis flags take comma lists; every combination runs.")
    p.add_argument("--plan", type=Path, metavar="FILE",
                   help="a TOML plan of the matrix (docs/cli.md, 'Plan files'); flags given "
                        "beside it override its values")
    add_axis_flags(p, RUN)
    add_options(p, RUN, option_keys(RUN, group=("max_batch", *MAX_BATCH_KEYS, *CLUSTER_KEYS)))
    p.add_argument("--format", default=None, choices=("table", "markdown", "json"),
                   help="table (default), markdown, or json (the records, alone on stdout)")
    search = p.add_argument_group(
        "the largest batch that fits (docs/tune.md)",
        "Short probes, each its own process, double the batch from --batch until one runs out of "
        "memory, then bisect; the full measurement (--warmup, --steps, --repeats) runs at the "
        "batch found. Rerunning the same command resumes the search.")
    add_option(search, "max_batch")
    add_options(search, RUN, MAX_BATCH_KEYS)
    add_cluster_options(p, RUN)
    remote = p.add_argument_group(
        "remote machines over SSH (needs the fleet extra: pip install 'stepbench[fleet]')",
        "Run the matrix on every host at once, each setup in its own process there, into the one "
        "results file here; records are tagged with the host's name. Device, model and sequence "
        "defaults are worked out on each host; --compile-cache names a folder there.")
    remote.add_argument("--host", action="append", metavar="NAME",
                        help="an SSH config alias or user@host[:port]; repeatable")
    remote.add_argument("--hosts-file", type=Path, metavar="FILE",
                        help="a file of hosts, one alias or user@host[:port] a line (# comments)")
    remote.add_argument("--ssh-config", type=Path, metavar="FILE",
                        help="the OpenSSH config to read instead of ~/.ssh/config")
    remote.add_argument("--remote-python", metavar="PATH",
                        help="the Python on the hosts that has torch; stepbench installs itself "
                             "into an environment that uses its packages (default python3)")
    remote.add_argument("--remote-setup", metavar="SHELL",
                        help="shell code run on each host before each stepbench command there, "
                             "in the same shell, e.g. 'module load cuda' or 'source "
                             "~/torch/bin/activate'")
    remote.add_argument("--remote-dir", metavar="DIR",
                        help="where stepbench keeps its environment and work files on the hosts "
                             "(default ~/.cache/stepbench)")
    rent = p.add_argument_group(
        "rented GPUs (needs the runcrate extra: pip install 'stepbench[runcrate]')",
        "Create one machine per --rent, run the matrix there as on an SSH host, and delete it "
        "whatever happens (done, failed, timed out, Ctrl-C, SIGTERM). API key from "
        "RUNCRATE_API_KEY. Records carry the provider's hourly price.")
    rent.add_argument("--rent", action="append", metavar="PROVIDER:GPU[:COUNT]",
                      help="rent a machine with this GPU type (and count, default 1) and run "
                           "there, e.g. runcrate:L40S or 'runcrate:RTX 5090'; repeatable")
    rent.add_argument("--rent-key", metavar="FILE",
                      help="the SSH private key to log in with; its public key is registered "
                           "with the provider once (default ~/.ssh/id_ed25519, id_ecdsa, id_rsa)")
    rent.add_argument("--rent-timeout", type=float, metavar="SECONDS",
                      help="how long a machine may take to start and answer SSH before it is "
                           "deleted (default 900)")
    rent.add_argument("--rent-max-minutes", type=int, metavar="MINUTES",
                      help="the provider deletes each machine after this many minutes whatever "
                           "happens here: the safety net if stepbench cannot (default 120)")
    rent.add_argument("--rent-template", metavar="NAME",
                      help="the provider's machine image (template); it must have Python 3.11+ "
                           "with torch (default: the provider's default)")
    rent.add_argument("--rent-prices", action="store_true", default=None,
                      help="with --dry-run: ask the providers for each rental's machine and "
                           "price now (needs the API key and the network; nothing is created). "
                           "Without it a dry run contacts nothing")
    p.set_defaults(handler=cmd_run)


def settings_of(args) -> RunSettings:
    """The run's settings: defaults, then the plan file's values, then the flags given."""
    from stepbench.cli.base import given
    from stepbench.plan import read_plan

    flags = given(args)
    plan = flags.pop("plan", None)
    return RunSettings.build(flags, read_plan(plan) if plan is not None else None)


def cmd_run(args) -> int:
    settings = settings_of(args)
    if settings.remote_run:
        return run_hosts(settings)
    if settings.cluster is not None:
        return run_cluster(settings)
    from stepbench.execute import pool
    from stepbench.execute.executor import LocalProcess
    from stepbench.execute.server import imports_for
    from stepbench.execute.progress import Display
    from stepbench.measure.machine import resolve_device
    from stepbench.hfconfig_check import check_configs
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile
    from stepbench.search.max_batch import check_searches

    local = settings.resolved(resolve_device(settings.device))
    plan = local.plan()
    with local.origin.checking("model"):    # a plan's model: the error names the plan
        check_configs(plan)
        check_models(plan)
    if local.max_batch is not None:
        check_searches(local.max_batch, plan, local.origin)
    if local.dry_run:
        print_plan(plan, local.format) if local.max_batch is None else \
            print_searches(plan, local)
        return 0
    if local.device == "cpu" and local.max_batch is None:
        check_memory(plan)
    if settings.device == "auto" and local.device == "cpu":
        model = "" if settings.values["model"] else " with the llama-tiny preset"
        say("run", f"no CUDA GPU found; running on the CPU{model} (pass --device cuda on a GPU "
                   "machine)")
    cache = None if local.compile_cache is None else \
        writable_folder(local.compile_cache, "--compile-cache", make=True)
    if local.profile is not None:
        writable_folder(local.profile, "--profile", make=True)
    gpus = pool.gpu_pool(local, plan)
    rendezvous = pool.rendezvous(local, gpus, plan)
    store = ResultsFile(local.out).check_writable()
    display = Display()
    executor = LocalProcess(compile_cache=cache, gpus=gpus, rendezvous=rendezvous,
                            start=local.start, preload=imports_for(plan), note=display.note)
    return run_plan(local, plan, executor, store, display)


def run_plan(local: RunSettings, plan, executor, store, display) -> int:
    """The plan (or its batch searches) through one executor into `store`; the records printed.
    Closes the display and the executor."""
    from stepbench.execute.runner import Runner
    from stepbench.search.max_batch import MaxBatch

    runner = Runner(executor, store, rerun=local.rerun, measure_peak=local.measure_peak,
                    run_id=getattr(executor, "run_id", None), profile=local.profile)
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


def check_memory(plan) -> None:
    """On a CPU, refuse a plan with a setup whose step needs more memory than this machine has
    available (measure/footprint.py's floor), before its process grows until the kernel kills
    it. A setup capped by --memory-limit-gb below that fails with `oom` instead; --max-batch
    and tune probe sizes that may not fit on purpose, and are not checked."""
    from stepbench.execute.oom import available_bytes
    from stepbench.measure.footprint import estimate
    from stepbench.units import gigabytes

    available = available_bytes()
    over = []
    for setup in plan:
        if setup.memory_limit_gb is not None and setup.memory_limit_gb * 1e9 < available:
            continue
        floor = estimate(setup)
        if floor is not None and floor.total > available:
            over.append((floor.total, setup, floor))
    if not over:
        return
    total, setup, floor = max(over, key=lambda item: item[0])
    parts = ", ".join(f"{name} {gigabytes(value / 1e9)}" for name, value in floor.parts.items()
                      if value >= 0.01 * total)
    more = f" (and {len(over) - 1} more setup{'s' if len(over) > 2 else ''})" if len(over) > 1 \
        else ""
    raise UserError(f"{setup.name} at batch {setup.batch} x seq {setup.seq}{more} needs at least "
                    f"{gigabytes(total / 1e9)} of memory ({parts}), and this machine has "
                    f"{gigabytes(available / 1e9)} available; lower --seq or --batch (--max-batch "
                    "with --memory-limit-gb finds the largest batch that fits)")


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


def run_cluster(settings: RunSettings) -> int:
    """`run --ray ADDRESS`, `run --slurm [PARTITION]`: each setup a job of the cluster
    (execute/raycluster.py, execute/slurmcluster.py)."""
    from stepbench.execute.clusters import check_cluster, cluster_device
    from stepbench.execute.progress import Display
    from stepbench.execute.runner import new_run_id
    from stepbench.hfconfig_check import check_configs
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile
    from stepbench.search.max_batch import check_searches

    engine = cluster_engine(settings.cluster)
    engine.require()
    if settings.dry_run:        # nothing is contacted, nothing started
        shown = "cuda" if settings.device == "auto" else settings.device
        local = settings.resolved(shown)
        if settings.device == "auto":
            say("run", "the cluster's device decides the defaults (its GPUs, else the CPU); "
                       f"shown: {shown}'s")
        print_plan(local.plan(), local.format) if local.max_batch is None else \
            print_searches(local.plan(), local)
        return 0
    engine.precheck(settings)
    store = ResultsFile(settings.out).check_writable()
    display = Display()
    try:
        cluster = engine.open_cluster(settings, display.note)
    except BaseException:
        display.close()
        raise
    try:
        local = settings.resolved(cluster_device(cluster, settings.device, settings.gpu_type))
        plan = local.plan()
        with local.origin.checking("model"):    # a plan's model: the error names the plan
            check_configs(plan)
            check_models(plan)
        if local.max_batch is not None:
            check_searches(local.max_batch, plan, local.origin)
        gpus = check_cluster(cluster, local.device, local.gpu_type, local.gpus, plan)
        executor = engine.executor_for(cluster, local, plan, gpus, new_run_id(), display.note)
        code = run_plan(local, plan, executor, store, display)
        if executor.lost and code == 0:
            say("run", f"{executor.lost}; the setups it did not run are not recorded; run the "
                       "same command again to resume")
            return 1
        return code
    finally:
        display.close()
        cluster.close()


def cluster_engine(flag: str):
    """The module that runs setups on the cluster `flag` names (--ray, --slurm)."""
    if flag == "--ray":
        from stepbench.execute import raycluster as engine
    else:
        from stepbench.execute import slurmcluster as engine
    return engine


def run_hosts(settings: RunSettings) -> int:
    """`run --host ... --rent ...`: the plan on every host and rented machine at once
    (execute/fleet.py, execute/rent.py)."""
    from stepbench.execute.fleet import check_hosts, report_failures, run_on_hosts
    from stepbench.execute.progress import Display
    from stepbench.hfconfig_check import check_configs
    from stepbench.measure.models import check_models
    from stepbench.record import ResultsFile

    # The flags are checked here, once, before any host is contacted.
    specs = check_hosts(settings)
    # Each host checks its own plan too, once its device is known.
    with settings.origin.checking("model"):
        resolved = settings.resolved("cpu" if settings.device == "auto" else settings.device)
        check_configs(resolved.plan())
        check_models(resolved.plan())
    if settings.dry_run:
        return dry_run_hosts(settings, specs)
    store = ResultsFile(settings.out).check_writable()
    display = Display()
    rentals = loop = None
    if settings.rent.specs:
        from stepbench.execute.rent import prepare_rentals
        from stepbench.execute.ssh import EventLoop

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
            from stepbench.execute.rent import cost_summary

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
    from stepbench.execute.rent import API_KEYS, check_rentals, quote_rentals

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
    return (f"{setup.name}  batch {setup.batch} x {setup.seq}  {setup.dtype}  "
            f"{setup.model_label}  {setup.device}")


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
