"""What a setup trains: a model, the inputs of one step, its loss, the units a batch holds and
its FLOPs. Two kinds: a Hugging Face causal LM from a preset or a config.json (workload/hf.py),
and the user's own factory, `--model path/file.py:make` or `--model pkg.module:make`
(workload/factory.py). The measuring code (measure/step.py) asks a `Built` workload
(workload/base.py) for everything it needs and never asks which kind it holds.

`Workload` is what a factory may return instead of `(model, make_batch)` to say more: the
loss, the units, the FLOPs, the optimizer, the block class (docs/workloads.md). Importing this
package imports nothing heavy: the CLI's parent process and the report read setups, not models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from stepbench.workload.spec import is_factory

__all__ = ["Workload", "is_factory", "build"]


def build(setup, device, rank: int = 0):
    """`setup`'s workload, built in its process (the seed is set): a workload.base.Built."""
    if is_factory(setup.model):
        from stepbench.workload.factory import FactoryBuilt

        return FactoryBuilt(setup, device)
    from stepbench.workload.hf import HFBuilt

    return HFBuilt(setup, device, rank)


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
