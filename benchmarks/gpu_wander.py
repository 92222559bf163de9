"""Issue 37's wander study, round by round in one call of at most 8 minutes: eager+sdpa of
llama-468m (batch 4 x 2048, bf16) in many processes, each way once a round, the ways' order
turned each round, so that every way sees the host over the same minutes:

  server    stepbench as it is (a process forked by the run's process server)
  nvml-off  the same with STEPBENCH_NVML=0 in the process (no NVML in or around it)
  pinned    the same with --pin-cpus auto; only on a host of more than one NUMA node (on one,
            auto binds to every core: nothing to measure; the summary says so)
  script    the post's own script (SEED, not in this repository; `eager sdpa` arguments, one
            JSON line), a fresh Python per process

One process server serves the three stepbench ways (a way's environment and --pin-cpus travel
with each job, as in any `stepbench run`), so a stepbench process costs its own seconds (about
4 s to start) rather than a server's start each; the script's cost about 15 s of imports. Every
PROFILE_EVERY-th round the server way's process also profiles one step after its timed ones
(`--profile`: the timed steps are the same), to set the record's host lead (`host_lead_ms`,
`host_bound`) against the profile's GPU busy share.

    OUT=dir SEED=path/to/seed_train.py PYTHONPATH=src python3 benchmarks/gpu_wander.py

Writes OUT/wander-{server,nvml-off,pinned,script}.jsonl (stepbench records, one per process; the
script's lines with the round added), OUT/traces.tar (the profiles), OUT/wander.log (the host:
versions, commit, lscpu, nvidia-smi topo; then each process) and OUT/summary.md, which it also
prints: benchmarks/wander_table.py's tables. At most 7 files, so that a GPU call brings all
back. BUDGET_S (default 450): no round starts that the slowest round so far (after the first)
says would end past it. WAYS (a comma list, default all four) measures only those ways, so that
more rounds fit the budget.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
# DEVICE, MODEL, SEQ and EXTRA (more flags) change the setup, for a check of this script on a CPU.
ARGS = ["run", "--device", os.environ.get("DEVICE", "cuda"),
        "--model", os.environ.get("MODEL", "llama-468m"), "--modes", "eager", "--attn", "sdpa",
        "--batch", "4", "--seq", os.environ.get("SEQ", "2048"), "--repeats", "1", "--rerun",
        "--timeout", "300", *os.environ.get("EXTRA", "").split()]


def environment(say) -> None:
    """Versions, commit, CPUs and NUMA, the GPU's topology: what host this was (into the log)."""
    lines = []
    for cmd in (["git", "-C", str(ROOT), "rev-parse", "HEAD"], ["nvidia-smi", "topo", "-m"],
                ["lscpu"], ["nvidia-smi", "-q", "-d", "CLOCK"],
                [sys.executable, "-c", "import torch, transformers; "
                 "print(torch.__version__, transformers.__version__)"]):
        try:
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"{exc}\n"
        lines.append(f"$ {' '.join(cmd)}\n{text}")
    say("the host:\n" + "\n".join(lines))


def open_executor(out: Path, note):
    """The local backend's site and executor for the plan of one eager+sdpa setup (as `stepbench
    run` makes them: cli/run.py), and that plan and its settings."""
    from stepbench.cli import build_parser
    from stepbench.cli.run import settings_of
    from stepbench.execute.registry import choose
    from stepbench.measure.models import check_models

    settings = settings_of(build_parser().parse_args([*ARGS, "--out", str(out)]))
    site = choose(settings).open(settings, note)
    local = settings.resolved(site.device(settings))
    plan = local.plan()
    check_models(plan)
    site.check(local, plan)
    return site, site.executor(local, plan, note), local, plan


def seed_path(value: str) -> str:
    """SEED as an absolute path, taken from the caller's folder: the script's processes run in
    ROOT, where a relative SEED names another file (the 2026-12-05 lease lost its script side so)."""
    return str(Path(value).expanduser().resolve())


def main() -> None:
    out = Path(os.environ["OUT"])
    seed = seed_path(os.environ["SEED"])
    budget_s = float(os.environ.get("BUDGET_S", 450))
    every = int(os.environ.get("PROFILE_EVERY", 3))
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    log = open(out / "wander.log", "a", buffering=1)

    def say(text: str) -> None:
        log.write(f"{time.monotonic() - began:7.1f} s  {text}\n")

    from stepbench.execute.runner import Runner
    from stepbench.measure.pinning import numa_nodes
    from stepbench.record import ResultsFile

    environment(say)
    nodes = numa_nodes()
    wanted = os.environ.get("WAYS", "server,nvml-off,pinned,script").split(",")
    if "script" in wanted and not Path(seed).is_file():
        sys.exit(f"gpu_wander: SEED {seed} is no file; copy the post's script there")
    unknown = set(wanted) - {"server", "nvml-off", "pinned", "script"}
    if unknown:
        sys.exit(f"WAYS: unknown way(s) {', '.join(sorted(unknown))}; "
                 "choose from server,nvml-off,pinned,script")
    ways = [w for w in wanted if w != "pinned" or (nodes and nodes > 1)]
    if "pinned" in wanted and "pinned" not in ways:
        say(f"pinned: skipped, {nodes or 'no'} NUMA node(s): auto would bind to every core")
    site, executor, local, plan = open_executor(out / "unused.jsonl", say)

    def runner(way: str, profile: bool = False) -> Runner:
        return Runner(executor, ResultsFile(out / f"wander-{way}.jsonl"), rerun=True,
                      measure_peak=local.measure_peak,
                      profile=out / "traces" if profile else None,
                      pin_cpus="auto" if way == "pinned" else "off")

    def stepbench(way: str, profile: bool) -> None:
        if way == "nvml-off":
            os.environ["STEPBENCH_NVML"] = "0"     # the job's environment is os.environ's
        try:
            (record,) = runner(way, profile).run(plan, repeats=1, timeout_s=300)
            say(f"{way}{' (profiled)' if profile else ''}: {record.status} "
                f"{record.step_ms or 0:.1f} ms, host lead {record.host_lead_ms} ms, "
                f"flags {record.noise_flags}")
        finally:
            os.environ.pop("STEPBENCH_NVML", None)

    def script(round_: int) -> None:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, seed, "eager", "sdpa"], capture_output=True,
                              text=True, timeout=300, cwd=ROOT)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        log.write(proc.stderr[-2000:])
        with open(out / "wander-script.jsonl", "a") as f:
            for line in lines:
                f.write(json.dumps({"round": round_, **json.loads(line)}) + "\n")
        say(f"script: exit {proc.returncode}, {time.monotonic() - start:.1f} s, "
            f"{len(lines)} line(s)")
        if not lines and round_ == 1:     # no comparison will come of it: spend no lease on it
            raise SystemExit(f"gpu_wander: the script gave no result in round 1 (exit "
                             f"{proc.returncode}): {proc.stderr.strip()[-300:]}")

    # A round's cost is guessed from the slowest round after the first (the first starts the
    # process server and measures the matmul rate), or the first's while it is the only one.
    rounds, took = 0, []
    try:
        while time.monotonic() - began + (max(took[1:] or took or [0.0])) <= budget_s:
            start = time.monotonic()
            order = ways[rounds % len(ways):] + ways[:rounds % len(ways)]
            say(f"round {rounds + 1}: {', '.join(order)}")
            for way in order:
                if way == "script":
                    script(rounds + 1)
                else:
                    stepbench(way, profile=way == "server" and rounds % every == every - 1)
            rounds += 1
            took.append(time.monotonic() - start)
    finally:
        executor.close()
        site.close()
        say(f"done: {rounds} rounds")
        pack(out / "traces")
    head = (f"{rounds} rounds in {time.monotonic() - began:.0f} s; ways: {', '.join(ways)}"
            + ("" if "pinned" in ways or "pinned" not in wanted
               else f" (pinned skipped: {nodes or 'no'} NUMA node(s))"))
    import wander_table

    with contextlib.redirect_stdout(io.StringIO()) as text:
        wander_table.main(str(out / "wander"))
    (out / "summary.md").write_text(f"{head}\n\n{text.getvalue()}")
    print(f"{head}\n\n{text.getvalue()}")


def pack(folder: Path) -> None:
    """The profiles' files as one tar beside the folder (what comes back from a GPU call is at
    most 8 files): OUT/traces.tar."""
    if not folder.is_dir():
        return
    with tarfile.open(folder.with_suffix(".tar"), "w") as tar:
        tar.add(folder, arcname=folder.name)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
