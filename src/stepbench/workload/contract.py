"""What a user's factory may return instead of `(model, make_batch)` (docs/workloads.md). A
module of its own, importing nothing: `stepbench.Workload` is this class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Workload:
    """What a factory returns when `(model, make_batch)` is not enough.

    model        an nn.Module; `model(**inputs)`, `model(*inputs)` or `model(inputs)` (a dict,
                 a tuple or anything else from make_batch) returns a scalar loss, an object
                 with `.loss`, or whatever `loss_fn` takes
    make_batch   () -> the inputs of one step, on the device the factory was given; called
                 once, and the same inputs are trained on every step (as a benchmark loop does)
    loss_fn      (output, inputs) -> scalar loss tensor; None: the model returns the loss
    units        what the throughput counts: "samples" (default), "tokens", "images", ...
    units_per_batch  how many units one batch holds; None: the batch size
    flops_per_step   FLOPs of one training step (forward + backward) for MFU; None: counted
                 with torch.utils.flop_counter.FlopCounterMode over one step
    optimizer    (parameters) -> torch.optim.Optimizer; None: AdamW(lr=1e-4) as --optimizer says
    block        the class of the model's repeated block: what `--compile-scope layer`
                 compiles one by one and `--checkpointing on` checkpoints; None: the class that
                 repeats most inside the model's ModuleLists and Sequentials
    """

    model: Any
    make_batch: Callable[[], Any]
    loss_fn: Callable[[Any, Any], Any] | None = None
    units: str = "samples"
    units_per_batch: int | None = None
    flops_per_step: float | None = None
    optimizer: Callable[[Any], Any] | None = None
    block: type | None = None
