"""Which GPUs of this host a run may use (`run --gpus`), and where a torchrun job's ranks meet.

A pool is a list of CUDA indices as this process sees them; the executor makes one slot per GPU
and shows each child only its slots' GPUs (execute/local/process.py).
"""

from __future__ import annotations

from stepbench.errors import UserError
from stepbench.execute.protocol import Rendezvous


def gpu_pool(settings, plan) -> list[int] | None:
    """The GPUs a run may use, as CUDA indices: --gpus all|N|I,J,...; without it, none (one
    setup at a time on what the processes see) unless a job needs several GPUs: then the first
    --nproc. A job of --nproc processes takes --nproc GPUs of the pool."""
    needed = max(s.nproc for s in plan) if settings.device == "cuda" else 1
    if settings.gpus is None:
        if needed == 1:
            return None
        spec = str(needed)
    else:
        spec = settings.gpus.strip()
    import torch

    count = torch.cuda.device_count()
    if spec == "all":
        gpus = list(range(count))
    else:
        gpus = _indices(spec)
        if "," not in spec:
            n = gpus[0]
            if not 1 <= n <= count:
                raise UserError(f"--gpus {n} asks for {n} GPUs and torch sees {count}; pass a "
                                f"number from 1 to {count}, 'all', or a list of indices like 0,1")
            gpus = list(range(n))
        else:
            bad = [i for i in gpus if not 0 <= i < count]
            if bad:
                raise UserError(f"--gpus {spec}: no GPU {bad[0]} here (torch sees {count}: "
                                f"indices 0 to {count - 1})")
    if needed > len(gpus):
        raise UserError(f"--nproc {needed} needs {needed} GPUs per job and the pool has "
                        f"{len(gpus)}; lower --nproc or pass more GPUs to --gpus")
    return gpus


def _indices(spec: str) -> list[int]:
    items = [item.strip() for item in spec.split(",")]
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise UserError(f"--gpus needs comma-separated integers, got {spec!r}") from None
    if len(set(values)) != len(values):
        raise UserError(f"--gpus {spec} names a GPU twice; name each GPU once")
    return values


def rendezvous(settings, gpus: list[int] | None, plan) -> Rendezvous:
    """torchrun's rendezvous for the run's distributed jobs (one node: a free local port)."""
    if settings.nnodes > 1 and gpus is not None and len(gpus) > max(s.nproc for s in plan):
        raise UserError("a job over several hosts runs one at a time, on --nproc GPUs of each "
                        "host; pass --gpus with exactly --nproc GPUs, or leave it out")
    return Rendezvous(nnodes=settings.nnodes, node_rank=settings.node_rank or 0,
                      endpoint=settings.rdzv_endpoint or None)
