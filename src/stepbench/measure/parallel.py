"""What a training step needs of data parallelism: the wrapper around the model, and the rank.

The wrappers are the ones the field uses, set up as torchtitan does:
- ddp: `DistributedDataParallel` around the model; compiled whole (scope model), torch.compile
  wraps the DDP module (its DDPOptimizer splits the graph at gradient buckets so that all-reduce
  overlaps backward); scope layer compiles each decoder layer in place before wrapping.
- fsdp2: `fully_shard` on each decoder layer, then on the root (embeddings, final norm, output
  layer: tied embeddings stay in one unit), whose gathered weights stay until the backward, as
  torchtitan keeps its last units; compiled, each decoder layer is compiled on its own before
  sharding (scope layer), so FSDP2's hooks stay outside the compiled regions. A user's model
  is sharded per block where its Workload names the block class, else as one unit, the root
  alone (compiled whole before sharding); `wrapping` says which, for the record. The setup's
  wrapping choices (axes fsdp_reshard, fsdp_unit, fsdp_prefetch, fsdp_optimizer; precision
  mixed-bf16 for FSDP2's MixedPrecisionPolicy) are applied here.

The rank's process around the step (process group, state file, gathering every rank's numbers)
is measure/distributed.py, which imports the step; the step imports only this.
"""

from __future__ import annotations

from stepbench.measure.options import (allow_a_graph_per_layer, compile_mode, compile_model,
                                       decoder_layers)


def rank() -> int:
    """This process's global rank; 0 outside a distributed job."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def wrap(setup, model, layers=None, units=None):
    """Wrap `model` for `setup.parallel` and return the callable a step runs.

    `layers(needed_by)`: the blocks `--compile-scope layer` compiles (default: a transformers
    model's decoder layers); `units`: (the blocks FSDP2 shards one by one, the name of their
    class), None: a transformers model's decoder layers; no blocks: the root alone.
    FSDP2 shards `model` in place (its parameters become DTensors), so the optimizer must be
    made from `model.parameters()` after this call.
    """
    import torch

    if setup.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.cuda.current_device()] if setup.device == "cuda" else None
        whole = setup.mode == "compile" and setup.compile_scope == "model"
        if not whole:
            compile_model(model, setup, layers=layers)  # eager: the model; scope layer: in place
        ddp = DistributedDataParallel(model, device_ids=ids)
        return torch.compile(ddp, mode=compile_mode(setup)) if whole else ddp
    if setup.parallel == "fsdp2":
        return shard(setup, model, None if units is None else list(units[0]))
    raise ValueError(f"unknown parallel style {setup.parallel!r}")


def wrapping(setup, units=None) -> str:
    """How the job wrapped the model, in words (the record's `scaling.wrapping`): the setup's
    own (Setup.wrapping), with a user's block class named, or "root alone" where FSDP2 had no
    block to shard."""
    if units is None:
        return setup.wrapping
    blocks, name = units
    return setup.wrapped_as(name if blocks else "")


def shard(setup, model, layers=None):
    """FSDP2 on `model` as the setup's wrapping choices say; returns the callable a step runs
    (`model`, sharded; a compiled wrapper of it where the root is the only unit)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Pure precisions gather and reduce in the weights' own dtype; mixed-bf16 keeps fp32 weights
    # (options.weight_dtype) and computes on bf16 copies, as torchtitan's default training does.
    # Layers' floating inputs are bf16 already: not cast again (torchtitan's cast_forward_inputs).
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                   cast_forward_inputs=False)
              if setup.dtype == "mixed-bf16" else MixedPrecisionPolicy())
    if layers is None:
        layers = decoder_layers(model, "--parallel fsdp2")
    if not layers:
        # The root alone: compiled whole first, so that FSDP2's hooks run around the compiled
        # module, eagerly, as around each compiled layer below.
        forward = torch.compile(model, mode=compile_mode(setup)) if setup.mode == "compile" else model
        fully_shard(forward, mp_policy=policy, reshard_after_forward=False)
        return forward
    if setup.mode == "compile":
        allow_a_graph_per_layer(len(layers))
        parents = {id(child): (parent, name) for parent in model.modules()
                   for name, child in parent.named_children()}
        for i, layer in enumerate(layers):
            # A compiled wrapper in the layer's place: FSDP2's hooks run around it, eagerly.
            parent, name = parents[id(layer)]
            layers[i] = torch.compile(layer, mode=compile_mode(setup))
            setattr(parent, name, layers[i])
    # Units of fsdp_unit consecutive layers: fully_shard on a list makes them one unit (one
    # all-gather before the first's forward, one reduce-scatter after the first's backward).
    units = [list(layers[i:i + setup.fsdp_unit]) for i in range(0, len(layers), setup.fsdp_unit)]
    for unit in units:
        fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=policy,
                    reshard_after_forward=setup.fsdp_reshard)
    # The root's weights (embeddings, final norm, output layer) are needed again as soon as the
    # backward starts: kept, as FSDP2's own default for the root does.
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)
    if setup.fsdp_prefetch:
        # One unit ahead, in the order the forward and the backward run them: a unit's forward
        # starts at its first layer, its backward at its last.
        model.set_modules_to_forward_prefetch([units[0][0]])
        model.set_modules_to_backward_prefetch([units[-1][-1]])
        for before, after in zip(units, units[1:]):
            before[-1].set_modules_to_forward_prefetch([after[0]])
            after[0].set_modules_to_backward_prefetch([before[-1]])
    return model
