"""A setup as one torchrun job: the process each rank runs, and the job's record from them all.

torchrun (`python -m torch.distributed.run`, started by execute/executor.py) runs `python -m
stepbench.measure.rank JOB` once per rank (which runs `main` here). Every rank builds the same model
from the same seed, wraps it for DDP or FSDP2 (measure/parallel.py), trains its own tokens (global
batch = per-rank batch x world size) and times its own steps with the loop every setup uses
(measure/step.py). Afterwards every rank's numbers are gathered, and the first process of each node
speaks the usual protocol (stepbench.protocol) to its parent: start, progress, then one result for
the whole job (`combine`: the slowest rank's step time, global and per-GPU tokens/s, the largest
peak memory, every rank's own numbers under `ranks`).

Failures: a rank that fails writes its status and error into its state file (STEPBENCH_RANK_DIR)
and exits non-zero; torchrun then stops the other ranks, and the parent reads the state files to
say which rank failed first and why. Every rank also writes the phase it entered there, so that a
job killed at its timeout says which rank was behind. A rank dies with torchrun (PR_SET_PDEATHSIG),
so a killed job leaves no process behind.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import NoReturn

from stepbench.process import die_with_parent, exit_now

RANK_DIR_ENV = "STEPBENCH_RANK_DIR"


# ---------------------------------------------------------------- what ranks tell each other

def rank_summary(measured: dict, *, rank_: int, local_rank: int, node: int) -> dict:
    """One rank's own numbers, as the record's `ranks` list holds them."""
    energy = measured.get("energy") or {}
    return {
        "rank": rank_, "local_rank": local_rank, "node": node, "hostname": socket.gethostname(),
        "gpu": physical_gpu(local_rank),
        "step_ms": measured.get("step_ms"), "step_ms_median": measured.get("step_ms_median"),
        "step_times_ms": measured.get("step_times_ms", []),
        "timed_wall_s": measured.get("timed_wall_s"), "host_lead_ms": measured.get("host_lead_ms"),
        "peak_memory_gb": measured.get("peak_memory_gb"),
        "peak_reserved_gb": measured.get("peak_reserved_gb"),
        "first_step_s": measured.get("first_step_s"),
        "loss_first": measured.get("loss_first"), "loss_last": measured.get("loss_last"),
        "joules_per_step": energy.get("joules_per_step"), "avg_watts": energy.get("avg_watts"),
        "noise_flags": measured.get("noise_flags", []),
    }


def physical_gpu(local_rank: int) -> str | None:
    """The GPU a rank runs on as this host's CUDA_VISIBLE_DEVICES names it (an index or UUID),
    or its CUDA index when the variable is unset; None on the CPU."""
    if os.environ.get("STEPBENCH_DEVICE") == "cpu":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [e.strip() for e in visible.split(",")]
        if local_rank < len(entries):
            return entries[local_rank]
    return str(local_rank)


def combine(setup, ranks: list[dict], measured: dict) -> dict:
    """The job's measured fields from every rank's summary (and rank 0's own `measured`).

    A step of the job ends when its slowest rank ends, so the job's step time is the slowest
    rank's mean and its step times are that rank's; tokens/s counts the global batch. Peak memory
    and the first step are the largest of any rank; energy is the sum over ranks. MFU is per GPU:
    rank 0's, scaled to the slowest rank's step time.
    """
    from stepbench.measure.step import step_time_summary

    ranks = sorted(ranks, key=lambda r: r["rank"])
    slowest = max(ranks, key=lambda r: r["step_ms"])
    # A user's workload counts its own units (units_per_step, per process); a transformers
    # model's batch x seq tokens.
    per_rank = measured.get("units_per_step") or setup.rank_tokens_per_step
    out = step_time_summary(slowest["step_times_ms"], per_rank * setup.world_size)
    out["timed_wall_s"] = max(r["timed_wall_s"] for r in ranks)

    def most(name):
        values = [r[name] for r in ranks if r.get(name) is not None]
        return max(values) if values else None

    for name in ("peak_memory_gb", "peak_reserved_gb", "first_step_s"):
        out[name] = most(name)
    means = [r["step_ms"] for r in ranks]
    out["ranks"] = ranks
    out["scaling"] = {
        "world_size": setup.world_size, "nnodes": setup.nnodes, "nproc_per_node": setup.nproc,
        "parallel": setup.parallel, "wrapping": measured.get("wrapping") or setup.wrapping,
        "backend": "nccl" if setup.device == "cuda" else "gloo",
        "slowest_rank": slowest["rank"],
        "rank_step_ms_spread": (max(means) - min(means)) / min(means),
        "tokens_per_s_per_gpu": per_rank / (slowest["step_ms"] / 1000),
        "peak_memory_gb_max": out["peak_memory_gb"],
        "efficiency": None, "baseline": None,       # filled by the runner where a baseline exists
    }
    ratio = measured["step_ms"] / slowest["step_ms"] if measured.get("step_ms") else None
    for name in ("achieved_tflops", "mfu_datasheet", "mfu_measured"):
        if measured.get(name) is not None and ratio is not None:
            out[name] = measured[name] * ratio
    joules = [r["joules_per_step"] for r in ranks]
    if measured.get("energy") and None not in joules:
        total = sum(joules)
        out["energy"] = {"joules_per_step": total,
                         "avg_watts": sum(r["avg_watts"] or 0 for r in ranks),
                         "tokens_per_kwh": (per_rank * setup.world_size / (total / 3.6e6)
                                            if total else None)}
    out["noise_flags"] = list(dict.fromkeys(f for r in ranks for f in r["noise_flags"]))
    if out["scaling"]["rank_step_ms_spread"] > 0.05:
        out["noise_flags"].append("rank_imbalance")
    return out


# ---------------------------------------------------------------- the rank's process

class RankState:
    """This rank's state file: the phase it entered, and how it failed (read by the parent)."""

    def __init__(self, folder: str | None, rank_: int):
        self.path = Path(folder) / f"rank-{rank_}.json" if folder else None
        self.data = {"rank": rank_, "host": socket.gethostname(), "phase": "starting",
                     "args": [], "status": None, "error": None}

    def write(self, **fields) -> None:
        self.data.update(fields, at=time.time())
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


class Quiet:
    """The channel of a rank that does not speak to the parent: it only keeps its measurements."""

    def __init__(self):
        os.dup2(2, 1)   # stray prints go to the log, never into the lead rank's protocol
        self.measured = {"phase": "starting"}

    def send(self, event: str, **fields) -> None:
        pass

    def progress(self, phase: str, *args, **info) -> None:
        self.measured["phase"] = phase


def enter_phase(state: RankState, phase: str, *args) -> None:
    """Write the phase this rank enters into its state file, where the parent reads which rank
    was behind at a timeout, or in which phase a rank failed."""
    state.write(phase=phase, args=list(args))


def main(argv: list[str]) -> NoReturn:
    die_with_parent()   # torchrun is the parent
    from stepbench.measure import worker
    from stepbench.setup import Setup

    job = json.loads(argv[0])
    setup = Setup.from_dict(job["setup"])
    global_rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    node = int(os.environ.get("GROUP_RANK", "0"))
    os.environ["STEPBENCH_DEVICE"] = setup.device
    lead = local_rank == 0
    channel = worker.Channel() if lead else Quiet()
    state = RankState(os.environ.get(RANK_DIR_ENV), global_rank)
    state.write()

    def progress(phase: str, *args, **info) -> None:
        enter_phase(state, phase, *args)
        if phase == "timed":
            # All ranks start their timed window together, so that no rank's first timed step
            # includes waiting for a rank still in its warm-up.
            import torch.distributed as dist

            dist.barrier()
        channel.progress(phase, *args, **info)

    from stepbench.measure.phases import Phases

    phases = Phases(channel.measured)
    status, error = "ok", None
    try:
        import torch
        import torch.distributed as dist

        from stepbench.measure import machine, models, step

        models.import_modeling(setup.model, setup.seq)
        phases.lap("imports")

        cuda = setup.device == "cuda"
        if cuda:
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        else:
            dist.init_process_group("gloo")
        channel.send("start", machine=machine.machine_info(setup.device, local_rank),
                     software=machine.software_info())
        phases.lap("device_init")       # with the process group's rendezvous
        peak = (worker.matmul_peak(setup, channel, local_rank, cached_only=bool(job.get("probe")))
                if job.get("measure_peak") else None)
        phases.lap("peak")
        worker.limit_memory(setup)
        # Every rank profiles the extra step (its collectives need them all), each to its own files.
        stem = job.get("profile") and f"{job['profile']}_rank{global_rank}"
        step.measure(setup, channel.measured, progress, phases, peak_tflops_measured=peak,
                     cache_label=worker.compile_cache_label(setup), profile=stem)
        mine = rank_summary(channel.measured, rank_=global_rank, local_rank=local_rank, node=node)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if lead:
            channel.measured.update(combine(setup, everyone, channel.measured))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, with its rank
        status, error = worker.classify_exception(exc)
        oom_gb = worker.memory_in_use_gb(setup.device) if status == "oom" else None
        if oom_gb is not None:
            channel.measured["oom_memory_gb"] = oom_gb
        state.write(status=status, error=error, oom_memory_gb=oom_gb,
                    traceback=traceback.format_exc()[-1500:])
        if status == "error" or isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()
        channel.send("result", status=status, error=f"rank {global_rank}: {error}",
                     measured=channel.measured)
        # Non-zero, so that torchrun stops the other ranks (stuck in a collective by now); no
        # clean-up that could wait on them.
        exit_now(1)
    state.write(status="ok")
    channel.send("result", status=status, error=error, measured=channel.measured)
    dist.destroy_process_group()
    exit_now(0)         # as a setup's process: no interpreter teardown (process.exit_now)
