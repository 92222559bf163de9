"""What a training step needs of data parallelism: the wrapper around the model, and the rank.

The wrappers are the ones the field uses, set up as torchtitan does:
- ddp: `DistributedDataParallel` around the model; compiled, torch.compile wraps the DDP module
  (its DDPOptimizer splits the graph at gradient buckets so that all-reduce overlaps backward).
- fsdp2: `fully_shard` on each decoder layer, then on the root (embeddings, final norm, output
  layer: tied embeddings stay in one unit); compiled, each decoder layer is compiled on its own
  before sharding, so FSDP2's hooks stay outside the compiled regions.

The rank's process around the step (process group, state file, gathering every rank's numbers)
is measure/distributed.py, which imports the step; the step imports only this.
"""

from __future__ import annotations

from stepbench.measure.options import decoder_layers


def rank() -> int:
    """This process's global rank; 0 outside a distributed job."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def wrap(setup, model):
    """Wrap `model` for `setup.parallel` and return the callable a step runs.

    FSDP2 shards `model` in place (its parameters become DTensors), so the optimizer must be
    made from `model.parameters()` after this call.
    """
    import torch

    compile_kwargs = {"mode": None if setup.compile_mode == "default" else setup.compile_mode}
    compiled = setup.mode == "compile"
    if setup.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.cuda.current_device()] if setup.device == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
        return torch.compile(ddp, **compile_kwargs) if compiled else ddp
    if setup.parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        layers = decoder_layers(model, "--parallel fsdp2")
        for i, layer in enumerate(layers):
            if compiled:
                layer = torch.compile(layer, **compile_kwargs)
                layers[i] = layer
            fully_shard(layer)
        fully_shard(model)
        return model
    raise ValueError(f"unknown parallel style {setup.parallel!r}")
