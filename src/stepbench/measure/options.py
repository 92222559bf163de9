"""What a setup does to its model beyond building it: precision, fused kernels, activation
checkpointing, the optimizer, and what torch.compile wraps. Runs in the child process only.

Each option is a small function of (model, setup), applied after the model is built and placed,
so that how the model is built can change without touching them. Optional packages (liger-kernel,
torchao, flash-attn) are imported only by a setup that asks for them; a missing one, or a device
that lacks a feature, raises `Unsupported` with the reason before anything is built, and the
worker records the setup as `unsupported` (it subclasses NotImplementedError, which the worker
already classifies so).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from stepbench.axes import AXES
from stepbench.errors import Unsupported   # raised here; callers import it from here too
from stepbench.setup import Setup

# Weights (and so gradients and optimizer state) per precision: autocast-bf16 and mixed-bf16
# keep fp32 master weights (mixed-bf16: FSDP2 gathers them as bf16, measure/parallel.py);
# float8 keeps bf16 weights and casts to float8 inside each converted linear layer.
WEIGHT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                 "autocast-bf16": torch.float32, "float8": torch.bfloat16,
                 "mixed-bf16": torch.float32}


def check_supported(setup: Setup) -> None:
    """Raise Unsupported, with the reason and the fix, when a field of `setup` holds a value
    this machine cannot run (the registry's reasons, axes.Axis.unsupported)."""
    for a in AXES:
        reason = a.why_not(getattr(setup, a.name), setup.device)
        if reason is not None:
            raise Unsupported(reason)


def weight_dtype(setup: Setup) -> torch.dtype:
    """The dtype of the weights, gradients and optimizer state."""
    return WEIGHT_DTYPES[setup.dtype]


def apply_options(model: torch.nn.Module, setup: Setup, checkpoint=None) -> torch.nn.Module:
    """Fused kernels, float8 linear layers and activation checkpointing, in that order, on a
    model already built, placed and cast to weight_dtype(setup). Returns the model.
    `checkpoint`: how the workload checkpoints its blocks (default: a transformers model's own
    gradient checkpointing)."""
    if setup.kernels != "none":
        apply_liger(model, setup.kernels)
    if setup.dtype == "float8":
        apply_float8(model)
    if setup.checkpointing and checkpoint is not None:
        checkpoint()
    elif setup.checkpointing:
        # Non-reentrant: the variant torch recommends, and the one torch.compile traces.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def apply_liger(model: torch.nn.Module, kernels: str) -> None:
    """liger-kernel's RMSNorm, RoPE, SwiGLU and (for "liger") fused linear cross-entropy, patched
    into this model instance by liger's own function for its model type (for llama,
    apply_liger_kernel_to_llama). liger skips a model type it has no kernels for without a word;
    here that is Unsupported, so that a "liger" row never measures the model's own kernels."""
    import inspect

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = model.config.model_type
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise Unsupported(f"--kernels {kernels}: liger-kernel has no kernels for model type "
                          f"{model_type!r}; use --kernels none")
    options = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                   fused_linear_cross_entropy=kernels == "liger")
    accepted = inspect.signature(apply).parameters
    apply(model=model, **{k: v for k, v in options.items() if k in accepted})


def apply_float8(model: torch.nn.Module) -> None:
    """Linear layers train in float8 (torchao, tensorwise scaling), all but the output layer
    (which produces the logits, kept in bf16 as torchtitan does) and any whose sizes are not
    multiples of 16 (float8 matmuls need them)."""
    from torchao.float8 import convert_to_float8_training

    # A transformers model's output layer; a user's model has none to keep out.
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def wanted(module: torch.nn.Module, fqn: str) -> bool:
        return (module is not output and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    convert_to_float8_training(model, module_filter_fn=wanted)


def make_optimizer(model: torch.nn.Module, setup: Setup) -> torch.optim.Optimizer:
    """AdamW(lr=1e-4), fused (one kernel for all parameters) or foreach (a few per group)."""
    impl = {"fused": True} if setup.optimizer == "fused" else {"foreach": True}
    if setup.parallel == "fsdp2" and setup.fsdp_optimizer == "local":
        return LocalShards(model.parameters(),
                           lambda tensors: torch.optim.AdamW(tensors, lr=1e-4, **impl))
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **impl)


class LocalShards:
    """AdamW over each rank's local shards of FSDP2's parameters (axis fsdp_optimizer "local").

    torch.optim over the DTensor parameters themselves (value "dtensor", what torchtitan and
    FSDP2's documentation do) sends every optimizer op through DTensor's dispatch, whose CPU cost
    grows with the number of parameters (pytorch/pytorch#134191; the fused path's per-step scalar
    tensors miss the sharding-propagation cache, #188174). AdamW is elementwise and FSDP2 shards
    every parameter on dim 0, so the same update on the local tensors (views of the sharded
    storage FSDP2 all-gathers from) is the same arithmetic in the same kernel without that
    dispatch: the gradients' local tensors are handed over before each step. Made at the first
    step, once FSDP2's lazy init has settled the sharded storage; a shard replaced later is an
    error, never a silently untrained parameter. What it changes on a GPU: benchmarks/README.md,
    section e.
    """

    def __init__(self, params, make):
        self.params = [p for p in params if p.requires_grad]
        self.make = make                # list of tensors -> torch.optim.Optimizer
        self.inner = None
        self.locals: list = []

    @property
    def state(self):
        return self.inner.state if self.inner is not None else {}

    def step(self) -> None:
        if self.inner is None:
            self.locals = [p._local_tensor for p in self.params]
            self.inner = self.make(self.locals)
        for param, local in zip(self.params, self.locals):
            if param._local_tensor is not local:
                raise RuntimeError("FSDP2 replaced a parameter's local shard after the first "
                                   "step; --fsdp-optimizer local cannot follow it (use dtensor)")
            local.grad = None if param.grad is None else param.grad._local_tensor
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None
        for local in self.locals:
            local.grad = None


def compile_model(model: torch.nn.Module, setup: Setup, layers=None):
    """The callable that runs the forward: the model itself in eager mode; torch.compile of the
    whole model; or the model with each decoder layer compiled in place (scope "layer").
    `layers(needed_by)`: the workload's blocks (default: a transformers model's decoder layers)."""
    if setup.mode != "compile":
        return model
    mode = compile_mode(setup)
    if setup.compile_scope == "model":
        return torch.compile(model, mode=mode)
    layers = (layers or functools.partial(decoder_layers, model))("--compile-scope layer")
    allow_a_graph_per_layer(len(layers))
    for layer in layers:
        layer.compile(mode=mode)
    return model


def allow_a_graph_per_layer(count: int) -> None:
    """Let dynamo compile each of `count` decoder layers, compiled one by one, to a graph of its own.

    The layers share one forward's code, and the step's forward passes each layer Hugging Face's
    KV cache (the model makes one in every forward, as the post's step does); the cache's entry
    for the layer's index is guarded, so layer i fails the guards of layer i-1's graph and
    recompiles. Past dynamo's recompile limit (8 per code object) the remaining layers would run
    eagerly, silently (benchmarks/README.md section e). The identical graphs after the first hit
    inductor's cache.
    """
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), count + 8))


def compile_mode(setup: Setup) -> str | None:
    """torch.compile's `mode` argument for the setup's compile mode (None: its default)."""
    return None if setup.compile_mode == "default" else setup.compile_mode


def decoder_layers(model: torch.nn.Module, needed_by: str) -> torch.nn.ModuleList:
    """The model's stack of decoder layers: `<base model>.layers` (llama, qwen, mistral...), else
    the first ModuleList of the classes transformers keeps whole (`_no_split_modules`; GPT-2's
    `transformer.h`). `needed_by` names the option that asked, for the Unsupported reason."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers):
        return layers
    whole = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if (isinstance(module, torch.nn.ModuleList) and len(module)
                and type(module[0]).__name__ in whole):
            return module
    raise Unsupported(f"{needed_by}: no stack of decoder layers found in "
                      f"{type(model).__name__}")


def forward_context(setup: Setup):
    """torch.autocast(bf16) around the forward for autocast-bf16; nothing otherwise."""
    if setup.dtype == "autocast-bf16":
        return torch.autocast(device_type=setup.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()
