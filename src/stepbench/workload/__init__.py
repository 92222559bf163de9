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

from stepbench.workload.contract import Workload
from stepbench.workload.spec import is_factory

__all__ = ["Workload", "is_factory", "build"]


def build(setup, device, rank: int = 0):
    """`setup`'s workload, built in its process (the seed is set): a workload.base.Built."""
    if is_factory(setup.model):
        from stepbench.workload.factory import FactoryBuilt

        return FactoryBuilt(setup, device)
    from stepbench.workload.hf import HFBuilt

    return HFBuilt(setup, device, rank)
