"""A workload built in a setup's process: what the measuring loop asks of it.

`Built` is the one interface measure/step.py sees: the model (placed and cast), the inputs of a
step, how the forward turns them into the loss, the units one batch holds, the repeated blocks
(per-layer compile, activation checkpointing), the optimizer, the tensors a step keeps, and the
FLOP fields of the record. workload/hf.py and workload/factory.py implement it.
"""

from __future__ import annotations

from typing import Any


class Built:
    """One setup's workload; subclasses fill in the model and the inputs."""

    model: Any                  # torch.nn.Module, placed on the device and cast
    inputs: Any                 # what one step trains on (made once)
    units: str | None = None    # the record's `units`; None: tokens, as stepbench 0.1 wrote
    units_per_batch: int = 0    # units one process trains per step

    def loss(self, forward):
        """The forward of one step through `forward` (the model, compiled or wrapped): the
        scalar loss tensor."""
        raise NotImplementedError

    def layers(self, needed_by: str):
        """The repeated blocks: what `--compile-scope layer` compiles one by one."""
        raise NotImplementedError

    def shard_units(self):
        """(the blocks `--parallel fsdp2` shards one by one, their class's name); None: a
        transformers model's decoder layers (measure/parallel.py)."""
        return None

    def enable_checkpointing(self) -> None:
        """Activation checkpointing (non-reentrant) of each repeated block."""
        raise NotImplementedError

    def make_optimizer(self, setup):
        from stepbench.measure import options

        return options.make_optimizer(self.model, setup)

    def held(self) -> list:
        """The input tensors a step keeps between steps."""
        return tensors_in(self.inputs)

    def record_fields(self) -> dict:
        """Fields of the record this workload adds (units and the like); {} for the HF path."""
        return {}

    def flop_fields(self, setup, units_per_s: float, peak_tflops_measured, count: bool) -> dict:
        raise NotImplementedError


def tensors_in(inputs) -> list:
    """The tensors in a batch: a tensor, or the tensors of a dict, tuple or list (one level
    deep, and nested containers)."""
    import torch

    if torch.is_tensor(inputs):
        return [inputs]
    if isinstance(inputs, dict):
        return [t for v in inputs.values() for t in tensors_in(v)]
    if isinstance(inputs, (list, tuple)):
        return [t for v in inputs for t in tensors_in(v)]
    return []
