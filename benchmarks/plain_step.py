"""A plain training-step script for the two examples, in the method stepbench measures with:
one process per setup, bf16 weights, fused AdamW(lr=1e-4), the first step timed on its own
(compilation included), 4 warm-up steps, 20 timed steps each between a CUDA event pair with one
synchronize after the last, peak memory as max_memory_allocated over the timed window.
It imports torch, torchvision and the example's model classes (examples/gpt.py's GPT); none of
stepbench's measuring code runs in this process.

    python3 benchmarks/plain_step.py gpt eager 8 1024 >> plain.jsonl
    python3 benchmarks/plain_step.py resnet compile 128 >> plain.jsonl
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"plain_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(which: str, batch: int, seq: int):
    """(model, step's forward: () -> loss), built as a script of its own would build them."""
    torch.manual_seed(0)
    if which == "gpt":
        gpt = example("gpt")
        with torch.device("cuda"):
            model = gpt.GPT(50304, seq, 12, 12, 768)
        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 50304, (batch, seq + 1), generator=gen).to("cuda")
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        model.to(dtype=torch.bfloat16)
        return model, lambda forward: forward(x, y)
    import torchvision

    model = torchvision.models.resnet50(weights=None).to("cuda")
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, 224, 224, generator=gen).to("cuda")
    labels = torch.randint(0, 1000, (batch,), generator=gen).to("cuda")
    model.to(dtype=torch.bfloat16)
    images = images.to(torch.bfloat16)
    return model, lambda forward: F.cross_entropy(forward(images).float(), labels)


def main(which: str, mode: str, batch: int, seq: int = 1) -> dict:
    start = time.perf_counter()
    model, loss_of = build(which, batch, seq)
    model.train()
    forward = torch.compile(model) if mode == "compile" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        loss = loss_of(forward)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses = [step()]
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - t0
    for _ in range(4):
        losses.append(step())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(20)]
    for begin, end in events:
        begin.record()
        losses.append(step())
        end.record()
    torch.cuda.synchronize()
    times = [b.elapsed_time(e) for b, e in events]
    return {"script": "plain_step.py", "model": which, "mode": mode, "batch": batch,
            "seq": seq if which == "gpt" else None, "step_ms": statistics.fmean(times),
            "step_ms_median": statistics.median(times), "step_times_ms": times,
            "first_step_s": first_step_s,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9,
            "loss_first": losses[0].item(), "loss_last": losses[-1].item(),
            "process_s": time.perf_counter() - start, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name()}


if __name__ == "__main__":
    which, mode, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    seq = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    print(json.dumps(main(which, mode, batch, seq)), flush=True)
