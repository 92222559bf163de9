"""Command line: every command's flags; each handler parses, builds, calls and prints.

A UserError becomes one line on stderr and exit code 2 (or its own `exit_code`: 1 for a results
file that could not be written); Ctrl-C exits 130, SIGTERM and SIGHUP 128 + their number, after
the running setups were stopped. Every other exception is a bug and keeps its traceback. Heavy
modules (torch, the report) are imported inside the handlers, so `--help` and `report` start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stepbench import __version__
from stepbench.errors import UserError
from stepbench.setup import DEVICE_DEFAULTS, Setup

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
DEFAULT_OUT = "stepbench-results.jsonl"


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: the problem and where the choices are, without the
    usage block (eight lines for `run`) that buries them."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stepbench",
        description="Benchmark a model's training step in several setups (eager or torch.compile, "
                    "attention kernels, batch sizes), each in its own process.")
    parser.add_argument("--version", action="version", version=f"stepbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run(sub)
    add_tune(sub)
    add_report(sub)
    add_peak(sub)
    add_prices(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from stepbench.execute.runner import Stopped

    try:
        return args.handler(args)
    except UserError as exc:
        print(f"stepbench {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_USER_ERROR)
    except Stopped as exc:
        print(f"stepbench {args.command}: stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"stepbench {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def stopped(command: str, exc: KeyboardInterrupt, what: str) -> int:
    """One line for a run stopped by Ctrl-C (KeyboardInterrupt) or SIGTERM / SIGHUP (Stopped,
    raised by the runner), saying `what` was kept; the exit code: 130, or 128 + the signal."""
    from stepbench.execute.runner import Stopped

    how = f"stopped by {exc}" if isinstance(exc, Stopped) else "interrupted"
    print(f"stepbench {command}: {how}; {what}; run the same command again to resume",
          file=sys.stderr)
    return 128 + exc.signum if isinstance(exc, Stopped) else EXIT_INTERRUPTED


# ---------------------------------------------------------------- run

def add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="run the matrix of setups, each in its own process",
        description="Run each setup (mode x attention x precision x ... x batch x seq) in its own "
                    "process and record step time, tokens/s, peak memory and first-step (compile) "
                    "time. Axis flags take comma lists; every combination runs.")
    d = RUN_DEFAULTS
    p.add_argument("--plan", type=Path, metavar="FILE",
                   help="a TOML plan of the matrix (docs in README, 'Plan files'); flags given "
                        "beside it override its values")
    p.add_argument("--model", help="preset (llama-468m, llama-135m, llama-small, llama-tiny) or path to an HF "
                   "config.json / folder; default llama-468m on a GPU, llama-tiny on the CPU")
    p.add_argument("--modes", help=f"comma list of eager, compile (default {d['modes']})")
    p.add_argument("--attn", help="comma list of attention implementations: eager, sdpa, "
                   f"flex_attention, flash_attention_2, flash_attention_3 (default {d['attn']})")
    p.add_argument("--compile-mode", help="torch.compile mode(s): default, reduce-overhead, "
                   "max-autotune, max-autotune-no-cudagraphs (default default)")
    p.add_argument("--compile-scope", help="what torch.compile wraps: model (whole) or layer "
                   "(each decoder layer on its own); comma list (default model)")
    p.add_argument("--precision", "--dtype", dest="precision",
                   help="bf16, fp16, fp32 (pure: weights, grads and optimizer state), autocast-bf16 "
                        "(fp32 master weights, bf16 autocast), float8 (torchao float8 linear "
                        "layers on bf16 weights); comma list (default bf16); --dtype is an alias")
    p.add_argument("--kernels", help="fused kernels: none, liger (liger-kernel RMSNorm, RoPE, "
                   "SwiGLU, fused linear cross-entropy), liger-no-flce (the same without the "
                   "fused cross-entropy); comma list (default none)")
    p.add_argument("--checkpointing", help="activation checkpointing: off, on, or off,on "
                   "(default off)")
    p.add_argument("--optimizer", help="AdamW implementation: fused, foreach; comma list "
                   "(default fused)")
    p.add_argument("--batch", help=f"batch size(s), comma list (default {d['batch']})")
    p.add_argument("--seq", help="sequence length(s), comma list; default 2048 on a GPU, 256 on the CPU")
    p.add_argument("--warmup", type=int, help=f"untimed steps after the first (default {d['warmup']})")
    p.add_argument("--steps", type=int, help=f"timed steps (default {d['steps']})")
    p.add_argument("--repeats", type=int,
                   help=f"processes per setup, interleaved across setups (default {d['repeats']})")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), help="default auto")
    p.add_argument("--seed", type=int, help="weights and tokens (default 0)")
    p.add_argument("--init", choices=("device", "cpu"),
                   help="where the random weights are drawn: device (fast; default) or cpu (as "
                        "stepbench 0.1 and the post's script: same weights as their records)")
    p.add_argument("--memory-limit-gb", type=float,
                   help="cap each child's memory (GPU: a fraction of the card) to see what fits a "
                        "smaller one")
    p.add_argument("--timeout", type=float,
                   help="seconds per setup before its process group is killed (default 1800 on a "
                        "GPU, 600 on the CPU)")
    p.add_argument("--compile-cache", type=Path,
                   help="share this inductor cache folder across setups and runs (default: a fresh "
                        "folder per setup, so the first compile is cold)")
    p.add_argument("--no-peak", action="store_true",
                   help="on a GPU, skip measuring the matmul rate (used for mfu_measured)")
    p.add_argument("--gpus", metavar="all|N|I,J,...",
                   help="run setups concurrently, one per GPU of this pool (all, the first N, or "
                        "these CUDA indices); each setup's process sees only its GPU(s)")
    p.add_argument("--nproc", type=int,
                   help="processes (GPUs) per node of each distributed job, with --parallel "
                        "(default 1); --batch is per process")
    p.add_argument("--parallel",
                   help="comma list of none, ddp, fsdp2: run each setup as a torchrun job of "
                        "--nproc processes with DistributedDataParallel or FSDP2 (none: one "
                        "process, the baseline of scaling efficiency)")
    p.add_argument("--nnodes", type=int,
                   help="hosts one distributed job spans (torchrun --nnodes; default 1)")
    p.add_argument("--node-rank", type=int,
                   help="this host's rank among --nnodes hosts (torchrun --node-rank)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="node 0's address and a free port there, where the hosts of a job meet "
                        "(torchrun --rdzv-endpoint; default: a free port on this host)")
    p.add_argument("--out", type=Path,
                   help=f"results file, JSON Lines, appended; rerun to resume (default {DEFAULT_OUT})")
    p.add_argument("--rerun", action="store_true",
                   help="measure every setup again even if the results file has it; the new "
                        "record is appended and replaces the old one in resume and report")
    p.add_argument("--dry-run", action="store_true",
                   help="print the setups the flags (and plan) expand to, run nothing")
    p.add_argument("--format", default="table", choices=("table", "markdown", "json"),
                   help="table (default), markdown, or json (the records, alone on stdout)")
    search = p.add_argument_group(
        "the largest batch that fits (README, 'Searching')",
        "Short probes, each its own process, double the batch from --batch until one runs out of "
        "memory, then bisect; the full measurement (--warmup, --steps, --repeats) runs at the "
        "batch found. Rerunning the same command resumes the search.")
    search.add_argument("--max-batch", action="store_true", default=None,
                        help="for each setup, find the largest batch that fits at its sequence "
                             "length, then measure that batch")
    search.add_argument("--max-batch-limit", type=int, metavar="N",
                        help=f"the largest batch a search tries (default {MAX_BATCH_DEFAULTS['max_batch_limit']})")
    search.add_argument("--probe-steps", type=int, metavar="N",
                        help="timed steps of a probe, after 1 warm-up step (default "
                             f"{MAX_BATCH_DEFAULTS['probe_steps']})")
    search.add_argument("--memory-margin", type=float, metavar="PERCENT",
                        help="on a GPU, the share of its memory (or of --memory-limit-gb) that "
                             "a chosen batch's peak reserved memory must leave free (default "
                             f"{MAX_BATCH_DEFAULTS['memory_margin']:g})")
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
    remote.add_argument("--remote-python", default="python3", metavar="PATH",
                        help="the Python on the hosts that has torch; stepbench installs itself "
                             "into an environment that uses its packages (default python3)")
    remote.add_argument("--remote-setup", metavar="SHELL",
                        help="shell code run on each host before each stepbench command there, "
                             "in the same shell, e.g. 'module load cuda' or 'source "
                             "~/torch/bin/activate'")
    remote.add_argument("--remote-dir", default=".cache/stepbench", metavar="DIR",
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
    rent.add_argument("--rent-timeout", type=float, default=900.0, metavar="SECONDS",
                      help="how long a machine may take to start and answer SSH before it is "
                           "deleted (default 900)")
    rent.add_argument("--rent-max-minutes", type=int, default=120, metavar="MINUTES",
                      help="the provider deletes each machine after this many minutes whatever "
                           "happens here: the safety net if stepbench cannot (default 120)")
    rent.add_argument("--rent-template", metavar="NAME",
                      help="the provider's machine image (template); it must have Python 3.11+ "
                           "with torch (default: the provider's default)")
    p.set_defaults(handler=cmd_run)


# What `run` uses where neither a flag nor a plan says otherwise (the device's own defaults,
# model, seq and timeout, are in setup.DEVICE_DEFAULTS).
RUN_DEFAULTS = {"modes": "eager,compile", "attn": "sdpa,eager", "compile_mode": "default",
                "compile_scope": "model", "precision": "bf16", "kernels": "none",
                "checkpointing": "off", "optimizer": "fused", "batch": "4", "warmup": 4,
                "steps": 20, "repeats": 1, "seed": 0, "device": "auto", "init": "device",
                "parallel": "none", "nproc": 1, "nnodes": 1, "out": Path(DEFAULT_OUT),
                "max_batch": False}
# --max-batch's options: applied only with it (given without it, they are an error).
MAX_BATCH_DEFAULTS = {"max_batch_limit": 4096, "probe_steps": 2, "memory_margin": 5.0}


def run_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The run's settings: defaults, then the plan file's values, then the flags given."""
    from stepbench.plan import read_plan

    settings = dict(RUN_DEFAULTS)
    if args.plan is not None:
        settings.update(read_plan(args.plan))
    settings.update({k: v for k, v in vars(args).items() if v is not None and k != "plan"})
    return argparse.Namespace(**{**{k: None for k in vars(args)}, **settings})


def check_run(args: argparse.Namespace, device: str) -> float:
    """The timeout for `device`, after checking the flags that do not depend on the plan."""
    timeout = args.timeout if args.timeout is not None else DEVICE_DEFAULTS[device]["timeout_s"]
    if timeout <= 0:
        raise UserError(f"--timeout must be > 0 seconds, got {timeout:g}")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    return timeout


def max_batch_options(args: argparse.Namespace):
    """search.max_batch.Options for `run --max-batch`, None without it."""
    given = [f"--{k.replace('_', '-')}" for k in MAX_BATCH_DEFAULTS if getattr(args, k) is not None]
    if not args.max_batch:
        if given:
            raise UserError(f"{given[0]} sets up the batch search; add --max-batch (or drop it)")
        return None
    if args.host or args.hosts_file or args.rent:
        raise UserError("--max-batch runs its probes on this machine; drop --host, --hosts-file "
                        "and --rent, or run `stepbench run --max-batch` on the host itself")
    from stepbench.search.max_batch import Options

    value = {k: getattr(args, k) if getattr(args, k) is not None else default
             for k, default in MAX_BATCH_DEFAULTS.items()}
    return Options(probe_steps=value["probe_steps"], limit=value["max_batch_limit"],
                   margin=value["memory_margin"] / 100)


def cmd_run(args: argparse.Namespace) -> int:
    args = run_settings(args)
    search = max_batch_options(args)
    if args.host or args.hosts_file or args.rent:
        return cmd_run_hosts(args)
    from stepbench.execute.executor import LocalProcess
    from stepbench.execute.progress import Display
    from stepbench.execute.runner import Runner
    from stepbench.measure.machine import resolve_device
    from stepbench.record import ResultsFile

    device = resolve_device(args.device)
    check_distributed_flags(args, device)
    plan = build_plan(args, device)
    timeout = check_run(args, device)
    if search is not None:
        search.check(plan)
    if args.dry_run:
        print_plan(plan, args.format) if search is None else print_searches(plan, search, args)
        return 0
    if args.device == "auto" and device == "cpu":
        model = "" if args.model else " with the llama-tiny preset"
        print(f"stepbench run: no CUDA GPU found; running on the CPU{model} (pass --device cuda "
              "on a GPU machine)", file=sys.stderr)
    gpus = gpu_pool(args, device, plan)
    rendezvous = rendezvous_from(args, gpus, plan)
    out = Path(args.out)
    store = ResultsFile(out).check_writable()
    executor = LocalProcess(compile_cache=args.compile_cache and Path(args.compile_cache),
                            gpus=gpus, rendezvous=rendezvous)
    runner = Runner(executor, store, timeout_s=timeout, display=Display(), rerun=args.rerun,
                    measure_peak=not args.no_peak)
    searched = []
    try:
        if search is None:
            records = runner.run(plan, repeats=args.repeats)
        else:
            from stepbench.search.max_batch import MaxBatch

            found = MaxBatch(runner, search, repeats=args.repeats).run(plan)
            records = [r for s in found for r in s.finals]
            searched = [p.record for s in found for p in s.probes] + records
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        return stopped("run", exc, f"the running setup was stopped, finished setups are kept "
                                   f"in {out}")
    finally:
        executor.close()
    print_records(args, records, searched)
    return 0


def cmd_run_hosts(args: argparse.Namespace) -> int:
    """`run --host ... --rent ...`: the plan on every host and rented machine at once
    (execute/fleet.py, execute/rent.py)."""
    from stepbench.execute.fleet import check_hosts, report_failures, run_on_hosts
    from stepbench.execute.progress import Display
    from stepbench.record import ResultsFile

    # The flags are checked here, once, before any host is contacted.
    specs = check_hosts(args)
    if args.gpus is not None or args.nproc != 1 or args.nnodes != 1 or args.parallel != "none":
        raise UserError("--host and --rent run one setup at a time on each machine's first GPU; "
                        "drop --gpus, --nproc, --nnodes and --parallel, or run stepbench on the "
                        "machine itself")
    device = "cpu" if args.device == "auto" else args.device
    plan = build_plan(args, device)
    check_run(args, device)
    if args.dry_run:
        # Nothing is contacted, nothing rented: the plan, and what each rental would cost now.
        if args.rent:
            from stepbench.execute.rent import quote_rentals

            for line in quote_rentals(args.rent):
                print(f"stepbench run: {line}", file=sys.stderr)
        if args.device == "auto":
            device = "cuda" if args.rent and not specs else device
            plan = build_plan(args, device)
            print(f"stepbench run: each machine runs the defaults of its own device; shown: "
                  f"{device}'s", file=sys.stderr)
        print_plan(plan, args.format)
        return 0
    store = ResultsFile(args.out).check_writable()
    display = Display()
    rentals = loop = None
    if args.rent:
        from stepbench.execute.rent import prepare_rentals
        from stepbench.execute.ssh import EventLoop

        loop = EventLoop()
        try:
            # Prices, the API key and the SSH key are checked before any machine is created.
            rentals = prepare_rentals(args.rent, args, loop, display.note)
        except BaseException:
            loop.close()
            raise
    try:
        runs = run_on_hosts(args, specs, build_plan, display, store, check_run, rentals, loop)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        display.close()
        kept = [lease for lease in rentals.leases if lease.delete_failed] if rentals else []
        for lease in kept:
            print(f"stepbench run: host {lease.name}: {lease.delete_failed}", file=sys.stderr)
        deleted = "; every rented machine was deleted" if rentals and not kept else ""
        return stopped("run", exc, f"the running setups were stopped on every host{deleted}, "
                                   f"finished setups are kept in {args.out}")
    finally:
        display.close()
        if rentals:
            from stepbench.execute.rent import cost_summary

            summary = cost_summary(rentals.leases)
            if summary:
                print(f"stepbench run: {summary}", file=sys.stderr)
            rentals.close()
    records = [record for run in runs for record in run.records]
    if records or args.format == "json":
        print_records(args, records)
    return report_failures(runs)


def print_records(args: argparse.Namespace, records, searched=()) -> None:
    """The run's records on stdout: a table (repeats combined) or the JSON array. `searched`:
    every record of `--max-batch`'s searches (for its details table), `records` their full
    measurements."""
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in records], indent=1))
        return
    from stepbench.report.document import run_document
    from stepbench.report.render import render

    print(render(run_document(records, searched), args.format), end="")
    print(f"results: {args.out}", file=sys.stderr)
    if args.repeats > 1:
        print(f"repeats combined, with confidence intervals and findings: stepbench report "
              f"{args.out}", file=sys.stderr)
    elif len({r.host for r in records}) > 1:
        print(f"the hosts compared, with findings and cost per token: stepbench report "
              f"{args.out}", file=sys.stderr)


def build_plan(args: argparse.Namespace, device: str):
    """The setups the settings ask for, checked before anything runs: every model/seq pair, and
    combinations that can never run (setup.matrix)."""
    from stepbench.measure.models import PRESETS, build_config
    from stepbench.setup import matrix, parse_list, parse_switches

    base = DEVICE_DEFAULTS[device]
    model = args.model or base["model"]
    seqs = parse_list("--seq", args.seq or str(base["seq"]), int)
    plan = matrix(models=[model], modes=parse_list("--modes", args.modes),
                  attns=parse_list("--attn", args.attn), batches=parse_list("--batch", args.batch, int),
                  seqs=seqs, compile_modes=tuple(parse_list("--compile-mode", args.compile_mode)),
                  compile_scopes=tuple(parse_list("--compile-scope", args.compile_scope)),
                  dtypes=tuple(parse_list("--precision", args.precision)),
                  kernels=tuple(parse_list("--kernels", args.kernels)),
                  checkpointing=tuple(parse_switches("--checkpointing", args.checkpointing)),
                  optimizers=tuple(parse_list("--optimizer", args.optimizer)),
                  parallels=tuple(parse_list("--parallel", args.parallel)), nproc=args.nproc,
                  nnodes=args.nnodes, device=device, warmup=args.warmup, steps=args.steps,
                  seed=args.seed, memory_limit_gb=args.memory_limit_gb, init=args.init)
    if model not in PRESETS:    # a preset is known good, and checking it would import transformers
        for seq in seqs:
            build_config(model, seq)
    return plan


def print_plan(plan, fmt: str) -> None:
    """--dry-run: the setups, one a line (or their `setup` objects as JSON), nothing run."""
    if fmt == "json":
        print(json.dumps([s.to_dict() for s in plan], indent=1))
        return
    for setup in plan:
        print(f"{setup.name}  batch {setup.batch} x {setup.seq}  {setup.dtype}  {setup.model_label}"
              f"  {setup.device}")
    print(f"{len(plan)} setups", file=sys.stderr)


def print_searches(plan, options, args: argparse.Namespace) -> None:
    """--dry-run --max-batch: the searches, one a line (or as JSON objects), nothing run."""
    from stepbench.search.max_batch import describe, describe_line

    items = describe(plan, options, args.repeats)
    if args.format == "json":
        print(json.dumps(items, indent=1))
        return
    for item in items:
        print(describe_line(item))
    print(f"{len(items)} searches", file=sys.stderr)


def check_distributed_flags(args: argparse.Namespace, device: str) -> None:
    """The distributed flags that can be judged before the model's config is read."""
    from stepbench.setup import PARALLELS, choose, parse_list

    parallels = parse_list("--parallel", args.parallel)
    for parallel in parallels:
        choose("parallel style (--parallel)", parallel, PARALLELS)
    for flag, value in (("--nproc", args.nproc), ("--nnodes", args.nnodes)):
        if value < 1:
            raise UserError(f"{flag} must be an integer >= 1, got {value}")
    if parallels == ["none"] and (args.nproc != 1 or args.nnodes != 1):
        raise UserError(f"--nproc {args.nproc} --nnodes {args.nnodes} needs a way to spread the "
                        "step: add --parallel ddp or --parallel fsdp2")
    if args.gpus is not None and device != "cuda":
        raise UserError("--gpus needs CUDA GPUs, and this run is on the CPU; drop --gpus (or "
                        "pass --device cuda on a GPU machine)")
    if args.nnodes > 1 and (args.node_rank is None or not args.rdzv_endpoint):
        raise UserError(f"--nnodes {args.nnodes} needs --node-rank (0 on the host given as the "
                        "endpoint) and --rdzv-endpoint HOST:PORT of node 0, on every host")
    if args.nnodes > 1 and not 0 <= args.node_rank < args.nnodes:
        raise UserError(f"--node-rank must be from 0 to {args.nnodes - 1}, got {args.node_rank}")
    if args.nnodes == 1 and args.node_rank not in (None, 0):
        raise UserError("--node-rank needs --nnodes 2 or more")


def gpu_pool(args: argparse.Namespace, device: str, plan) -> list[int] | None:
    """The GPUs a run may use, as CUDA indices: --gpus all|N|I,J,...; without it, none (one
    setup at a time on what the processes see) unless a job needs several GPUs: then the first
    --nproc. A job of --nproc processes takes --nproc GPUs of the pool."""
    needed = max(s.nproc for s in plan) if device == "cuda" else 1
    if args.gpus is None:
        if needed == 1:
            return None
        spec = str(needed)
    else:
        spec = args.gpus.strip()
    import torch

    from stepbench.setup import parse_list

    count = torch.cuda.device_count()
    if spec == "all":
        gpus = list(range(count))
    elif "," not in spec:
        n = parse_list("--gpus", spec, int)[0]
        if not 1 <= n <= count:
            raise UserError(f"--gpus {n} asks for {n} GPUs and torch sees {count}; pass a number "
                            f"from 1 to {count}, 'all', or a list of indices like 0,1")
        gpus = list(range(n))
    else:
        gpus = [int(i) for i in parse_list("--gpus", spec, int)]
        if len(gpus) != len(spec.split(",")):
            raise UserError(f"--gpus {spec} names a GPU twice; name each GPU once")
        bad = [i for i in gpus if not 0 <= i < count]
        if bad:
            raise UserError(f"--gpus {spec}: no GPU {bad[0]} here (torch sees {count}: indices "
                            f"0 to {count - 1})")
    if needed > len(gpus):
        raise UserError(f"--nproc {needed} needs {needed} GPUs per job and the pool has "
                        f"{len(gpus)}; lower --nproc or pass more GPUs to --gpus")
    return gpus


def rendezvous_from(args: argparse.Namespace, gpus: list[int] | None, plan):
    """torchrun's rendezvous for the run's distributed jobs (one node: a free local port)."""
    from stepbench.execute.executor import Rendezvous

    if args.nnodes > 1 and gpus is not None and len(gpus) > max(s.nproc for s in plan):
        raise UserError("a job over several hosts runs one at a time, on --nproc GPUs of each "
                        "host; pass --gpus with exactly --nproc GPUs, or leave it out")
    return Rendezvous(nnodes=args.nnodes, node_rank=args.node_rank or 0,
                      endpoint=args.rdzv_endpoint or None)


# ---------------------------------------------------------------- tune

DEFAULT_TUNE_OUT = "stepbench-tune.jsonl"


def add_tune(sub) -> None:
    p = sub.add_parser(
        "tune", help="search the axes for the fastest setup of a model within a time budget",
        description="Search for the fastest setup of one model on this machine within a time "
                    "budget: short probes first (attention kernels, eager and compiled), then "
                    "larger batches, then one option at a time, then the best two measured in "
                    "full with repeats. Every probe is a record in --out: a tune resumes, and "
                    "`stepbench report` shows it. Axis flags narrow the search to their values.")
    p.add_argument("--model", help="preset or path to an HF config (default llama-468m on a GPU, "
                   "llama-tiny on the CPU)")
    p.add_argument("--budget", required=True, help="time for the whole search: 20m, 90s, 1h30m")
    p.add_argument("--objective", choices=("tokens", "fit"), default="tokens",
                   help="tokens: the most tokens/s, the batch grown from --batch; fit: the "
                        "fastest setup whose step at --batch fits --memory-limit-gb (default "
                        "tokens)")
    p.add_argument("--memory-limit-gb", type=float,
                   help="cap each setup's memory (a smaller card); required by --objective fit")
    p.add_argument("--batch", type=int, default=4, help="the batch the search starts from "
                   "(fit: the batch to fit; default 4)")
    p.add_argument("--seq", type=int, help="sequence length (default 2048 on a GPU, 256 on the CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", help="comma list of eager, compile to search (default both)")
    p.add_argument("--attn", help="attention kernels to search (default: all this machine runs)")
    p.add_argument("--compile-mode", help="compile modes to try, the first as the start "
                   "(default: default, and on a GPU reduce-overhead, max-autotune-no-cudagraphs)")
    p.add_argument("--compile-scope", help="model, layer (default both)")
    p.add_argument("--precision", help="precisions to try, the first as the start (default "
                   "bf16, and float8 where torchao and the GPU allow)")
    p.add_argument("--kernels", help="fused kernels to try, the first as the start (default none, "
                   "and liger-no-flce, liger where liger-kernel is installed)")
    p.add_argument("--optimizer", help="fused, foreach (default both)")
    p.add_argument("--checkpointing", help="off, on (default both)")
    p.add_argument("--repeats", type=int, default=3,
                   help="processes per finalist in the final measurement (default 3)")
    p.add_argument("--warmup", type=int, default=RUN_DEFAULTS["warmup"],
                   help=f"warm-up steps of the final measurement (default {RUN_DEFAULTS['warmup']})")
    p.add_argument("--steps", type=int, default=RUN_DEFAULTS["steps"],
                   help=f"timed steps of the final measurement (default {RUN_DEFAULTS['steps']})")
    p.add_argument("--timeout", type=float, help="seconds per process at most (default: the "
                   "budget left)")
    p.add_argument("--compile-cache", type=Path,
                   help="inductor cache folder shared by the tune's processes (default: "
                        "stepbench's cache folder, ~/.cache/stepbench/inductor)")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_TUNE_OUT),
                   help=f"results file, JSON Lines; rerun to resume (default {DEFAULT_TUNE_OUT})")
    p.add_argument("--format", default="table", choices=("table", "markdown", "json"),
                   help="table (default), markdown, or json: one object with winner, runner_up, "
                        "tried and command")
    p.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from stepbench.execute.executor import LocalProcess
    from stepbench.execute.progress import Display
    from stepbench.execute.runner import Runner
    from stepbench.measure.cache import cache_dir
    from stepbench.measure.machine import resolve_device
    from stepbench.measure.models import PRESETS, build_config
    from stepbench.record import ResultsFile
    from stepbench.search import tune

    budget = tune.parse_budget(args.budget)
    device = resolve_device(args.device)
    if args.objective == "fit" and args.memory_limit_gb is None:
        raise UserError("--objective fit needs --memory-limit-gb N, the memory the step must "
                        "fit in")
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    space, skipped = tune_space(args, device)
    base = DEVICE_DEFAULTS[device]
    setup = Setup(model=args.model or base["model"], mode="eager", attn=space.attns[0],
                  batch=args.batch, seq=args.seq or base["seq"], dtype=space.precisions[0],
                  device=device, warmup=args.warmup, steps=args.steps, seed=args.seed,
                  memory_limit_gb=args.memory_limit_gb, kernels=space.kernels[0],
                  checkpointing=space.checkpointing[0], optimizer=space.optimizers[0],
                  init=RUN_DEFAULTS["init"]).check()
    if setup.model not in PRESETS:
        build_config(setup.model, setup.seq)
    timeout = args.timeout if args.timeout is not None else DEVICE_DEFAULTS[device]["timeout_s"]
    if timeout <= 0:
        raise UserError(f"--timeout must be > 0 seconds, got {timeout:g}")
    store = ResultsFile(args.out).check_writable()
    executor = LocalProcess(compile_cache=args.compile_cache or cache_dir() / "inductor")
    runner = Runner(executor, store, timeout_s=timeout, display=Display())
    say = lambda text: print(f"stepbench tune: {text}", file=sys.stderr)  # noqa: E731
    tuner = tune.Tuner(runner, setup, space, budget_s=budget, objective=args.objective,
                       timeout_s=timeout, repeats=args.repeats,
                       final_steps=(args.warmup, args.steps), skipped=skipped, say=say)
    try:
        result = tuner.run()
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM / SIGHUP as Stopped
        return stopped("tune", exc, f"what it measured is kept in {args.out}")
    finally:
        executor.close()
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        print(tune.render(result, args.format), end="")
        print(f"results: {args.out} (stepbench report {args.out})", file=sys.stderr)
    return 0 if result.winner is not None else 1


def tune_space(args: argparse.Namespace, device: str):
    """The search space: what this machine runs, narrowed by the axis flags given."""
    from stepbench.search.tune import default_space
    from stepbench.setup import (ATTENTIONS, COMPILE_MODES, COMPILE_SCOPES, DTYPES, KERNELS,
                                 MODES, OPTIMIZERS, choose, parse_list, parse_switches)

    space, notes = default_space(device)
    for flag, name, valid in (("--modes", "modes", MODES), ("--attn", "attns", ATTENTIONS),
                              ("--compile-mode", "compile_modes", COMPILE_MODES),
                              ("--compile-scope", "compile_scopes", COMPILE_SCOPES),
                              ("--precision", "precisions", DTYPES),
                              ("--kernels", "kernels", KERNELS),
                              ("--optimizer", "optimizers", OPTIMIZERS)):
        given = getattr(args, flag[2:].replace("-", "_"))
        if given is not None:
            values = parse_list(flag, given)
            for value in values:
                choose(flag[2:].replace("-", " "), value, valid)
            setattr(space, name, values)
            notes.pop(name, None)       # the flag chose the values: nothing was left out
    if args.checkpointing is not None:
        space.checkpointing = parse_switches("--checkpointing", args.checkpointing)
    return space, [text for texts in notes.values() for text in texts]


# ---------------------------------------------------------------- report

REPORT_FORMATS = ("table", "markdown", "csv", "json", "html")


def add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="join result files into one table with cost per token, findings, plots",
        description="Join result files from any number of machines into one table (GPU x "
                    "setup) with cost per token and findings written from the numbers.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="results files (*.jsonl) or folders of them")
    p.add_argument("--prices", metavar="FILE",
                   help="price list, .toml ([prices] \"GPU name\" = dollars per hour) or .csv "
                        "(gpu,price_per_hour); see docs/report.md")
    p.add_argument("--price", action="append", default=[], metavar="GPU=DOLLARS",
                   help='price of one GPU per hour, repeatable, over the price file: '
                        '--price "NVIDIA H100 PCIe=3.86"')
    p.add_argument("--energy-price", metavar="DOLLARS_PER_KWH",
                   help="price of electricity in dollars per kWh: adds the GPU's energy cost "
                        "per million tokens to the details (records with NVML energy only)")
    p.add_argument("--format", choices=REPORT_FORMATS, default="table",
                   help="output format (default: table)")
    p.add_argument("--out", metavar="PATH", help="write the output here instead of stdout")
    p.add_argument("--plots", metavar="DIR", help="also write the plots as PNG files into DIR")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from stepbench.report.document import report_document, warn
    from stepbench.report.render import render, write_output

    doc = report_document(args.files, price_file=args.prices, price_flags=args.price,
                          energy_price=args.energy_price, plots=bool(args.plots) or args.format == "html")
    text = render(doc, args.format)
    if args.plots:
        for path in doc.write_plots(Path(args.plots)):
            warn(f"wrote {path}", prefix="")
    if args.out:
        write_output(text, Path(args.out))
        warn(f"wrote {args.out}", prefix="")
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------- peak

def add_peak(sub) -> None:
    p = sub.add_parser(
        "peak", help="measure the dense matmul rate of this device and compare it with the "
                     "datasheet peak",
        description="Measure the dense matmul rate (TFLOP/s) of this device on random n x n "
                    "matrices and print it next to the vendor's dense datasheet peak.")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to measure; auto: cuda when available, else cpu "
                        "(default: %(default)s)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "tf32"), default="bf16",
                   help="matrix dtype; fp32 uses CUDA cores, tf32 tensor cores on fp32 "
                        "tensors (CUDA only) (default: %(default)s)")
    p.add_argument("--size", type=int, default=None, metavar="N",
                   help="matrix size n (default: 8192 on cuda, 1024 on cpu)")
    p.add_argument("--repeats", type=int, default=None, metavar="R",
                   help="timed repeats; the median is reported (default: 20 on cuda, 5 on cpu)")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="run products back to back for SECONDS before timing, to measure "
                        "the rate under the GPU's power cap instead of the burst rate at "
                        "full boost clock (CUDA only) (default: %(default)s)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table for people, json (one object) for scripts (default: %(default)s)")
    p.set_defaults(handler=cmd_peak)


def cmd_peak(args: argparse.Namespace) -> int:
    from stepbench.measure.peaks import measure_peak

    result = measure_peak(args.device, args.dtype, args.size, args.repeats, args.sustained)
    if args.format == "json":
        print(json.dumps(result))
    else:
        from stepbench.report.render import render
        from stepbench.report.document import peak_document

        print(render(peak_document(result), "table"), end="")
    return 0


# ---------------------------------------------------------------- prices

def add_prices(sub) -> None:
    p = sub.add_parser(
        "prices", help="write a provider's hourly GPU prices as a price file for report --prices",
        description="Ask a GPU provider for today's hourly prices of its instance types and "
                    "write them in the price-file format `stepbench report --prices` reads "
                    "(dollars per GPU-hour, the cheapest offer of each GPU type).")
    p.add_argument("--from", dest="provider", required=True, metavar="PROVIDER",
                   help="the provider: runcrate (its API key from the environment: "
                        "RUNCRATE_API_KEY)")
    p.add_argument("--out", type=Path, metavar="FILE",
                   help="write the TOML price file here (default: stdout)")
    p.set_defaults(handler=cmd_prices)


def cmd_prices(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from stepbench.execute.rent import PROVIDERS, ProviderError, price_file, provider

    if args.provider not in PROVIDERS:
        raise UserError(f"--from {args.provider!r}: unknown provider; choose one of: "
                        + ", ".join(PROVIDERS))
    chosen = provider(args.provider)
    try:
        offers = chosen.prices()
    except ProviderError as exc:
        raise UserError(str(exc)) from None
    if not offers:
        raise UserError(f"{args.provider} lists no instance types right now; try again later")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = price_file(offers, args.provider, when)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text)
    except OSError as exc:
        raise UserError(f"cannot write {args.out} ({exc.strerror}); pass a writable --out path") \
            from None
    count = sum(1 for line in text.splitlines() if line.startswith('"'))
    print(f"wrote {args.out}: {count} GPU types from {args.provider}; use it with stepbench "
          f"report --prices {args.out}", file=sys.stderr)
    return 0
