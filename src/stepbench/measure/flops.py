"""Model FLOPs per token, FLOPs counted by torch, GPU peaks, and MFU.

MFU (model FLOPs utilisation) turns a step time into "how much of the GPU did this setup use",
which is what makes eager and compiled setups, or two GPUs, comparable. Three numbers go into it
and each can be wrong in its own way, so each is kept separately in the result record:

* the model's FLOPs per token, from a written-out formula (`CONVENTION`), not from what a kernel
  happened to execute: a setup that recomputes activations or skips masked attention blocks does
  not change the model's FLOPs, only its speed;
* the FLOPs that `torch.utils.flop_counter.FlopCounterMode` counts for one real step, as a
  cross-check of the formula on the model actually built;
* the peak: the vendor's dense datasheet number (`DATASHEET_PEAK_TFLOPS`) and the matmul rate
  measured on the device (`measure_matmul_tflops`), because datasheet peaks are rarely reachable
  (docs/mfu.md).

Nothing here imports transformers at module level: the runner's parent process imports stepbench
without paying for it.
"""

from __future__ import annotations

from typing import Any

import torch

from stepbench.measure.peaks import datasheet_peak

# ----------------------------------------------------------------------------------------------
# FLOPs per token: the formula
# ----------------------------------------------------------------------------------------------

CONVENTION = (
    "6*N' + 12*L*d*T per token (N' = parameters that take part in matmuls: all parameters "
    "except embedding lookups, with the output projection counted even when tied; L = layers; "
    "d = attention width, heads * head_dim; T = sequence length; non-causal attention; "
    "forward + backward = 3x forward)"
)


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """Return (total, non_embedding) parameter counts of `model`.

    total counts every parameter once (tied weights once), like `sum(p.numel())`. non_embedding
    (N') drops the weights of every `nn.Embedding` (a lookup multiplies nothing) but keeps the
    output projection: if it is tied to the input embedding, the tied matrix is added back,
    because the lm_head matmul costs 2*V*d FLOPs per token whether or not its weight is shared.
    Works on a model built on the "meta" device.
    """
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    embedding_weights = {id(m.weight): m.weight for m in model.modules()
                         if isinstance(m, torch.nn.Embedding) and m.weight is not None}
    non_embedding = total - sum(w.numel() for w in embedding_weights.values())
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    output_weight = getattr(output, "weight", None)
    if output_weight is not None and id(output_weight) in embedding_weights:
        non_embedding += output_weight.numel()
    return total, non_embedding


def non_embedding_params(model: torch.nn.Module) -> int:
    """N' of `model`: parameters without embedding lookups (see `count_params`)."""
    return count_params(model)[1]


def meta_model(config: Any) -> torch.nn.Module:
    """Build the causal LM of `config` on the "meta" device: exact parameter shapes, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def attention_width(config: Any) -> int:
    """d of the attention term: num_attention_heads * head_dim.

    This is hidden_size for most models, but not for those whose heads are wider or narrower
    than hidden_size / heads (e.g. Gemma, Qwen3): there the score and value matmuls work on
    heads * head_dim, so that is what the attention FLOPs scale with. Grouped-query attention does
    not change it: every query head still multiplies against a full key and value.
    """
    text = _text_config(config)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return heads * head_dim


def flops_per_token(config: Any, seq: int, causal: bool = False, *,
                    params_non_embedding: int | None = None) -> float:
    """Training FLOPs per token, forward + backward, by `CONVENTION` (causal: half the
    attention term, 6*L*d*T).

    `config` is a transformers config of a decoder-only causal LM. `params_non_embedding` is N'
    from `count_params(model)` of the model you built; without it the model is built on the meta
    device to count it (about 0.1 s for a 0.5B model), which is exact for any architecture
    transformers knows, unlike a per-architecture formula over config fields.

    The attention term assumes full attention over all `seq` positions in every layer: models with
    sliding-window or linear-attention layers get an over-estimate of that term.
    """
    if seq <= 0:
        raise ValueError(f"seq must be positive, got {seq}")
    if params_non_embedding is None:
        params_non_embedding = non_embedding_params(meta_model(config))
    layers = _text_config(config).num_hidden_layers
    attention_factor = 6 if causal else 12
    return float(6 * params_non_embedding + attention_factor * layers * attention_width(config) * seq)


def _text_config(config: Any) -> Any:
    # Multimodal configs nest the language model's config; plain LM configs return themselves.
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


# ----------------------------------------------------------------------------------------------
# FLOPs per step: counted by torch
# ----------------------------------------------------------------------------------------------

# The SDPA kernels whose FLOP formulas take (query, key, value, ...) shapes, and those that take
# (grad_out, query, key, value, ...): the CPU flash kernel torch has no formula for, and the CUDA
# kernels torch has formulas for that reject grouped-query attention up to torch 2.12.
_SDPA_FORWARD_OPS = ("_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention")
_SDPA_BACKWARD_OPS = tuple(f"{name}_backward" for name in _SDPA_FORWARD_OPS)


def _kv_shape_with_query_heads(query_shape, kv_shape):
    """`kv_shape` with the query's head count: GQA counted as the convention counts it.

    Under grouped-query attention (SDPA's enable_gqa) key and value come with fewer heads than the
    query, (batch, kv_heads, seq, head_dim), and each key/value head serves a group of query heads.
    Every query head still multiplies against a full key and value, so the FLOPs are those of
    key/value repeated to the query's heads. Shapes that are not 4-D (nested, varlen) or whose
    heads do not divide are returned as they are, for torch's own checks to judge.
    """
    if len(query_shape) != 4 or len(kv_shape) != 4:
        return kv_shape
    heads, kv_heads = query_shape[1], kv_shape[1]
    if kv_heads == heads or kv_heads <= 0 or heads % kv_heads:
        return kv_shape
    return (kv_shape[0], heads, *kv_shape[2:])


def _gqa_sdpa_flop(formula):
    """A forward formula that passes key/value shapes to `formula` with the query's head count."""
    def flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return formula(query_shape, _kv_shape_with_query_heads(query_shape, key_shape),
                       _kv_shape_with_query_heads(query_shape, value_shape), *args,
                       out_shape=out_shape, **kwargs)
    return flop


def _gqa_sdpa_backward_flop(formula):
    """A backward formula that passes key/value shapes to `formula` with the query's head count."""
    def flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
             **kwargs) -> int:
        return formula(grad_out_shape, query_shape,
                       _kv_shape_with_query_heads(query_shape, key_shape),
                       _kv_shape_with_query_heads(query_shape, value_shape), *args,
                       out_shape=out_shape, **kwargs)
    return flop


def _torch_shape_formula(flop_counter, op, fallback_name: str):
    """torch's FLOP formula for `op` taking shapes, else its formula named `fallback_name`, or None.

    torch registers its shape formulas wrapped to turn tensors into shapes (functools.wraps keeps
    the shape formula as __wrapped__); FlopCounterMode wraps the custom mapping the same way, so
    the wrappers here receive shapes and delegate to the unwrapped formula. A formula registered
    raw (it takes tensors) is not used: the fallback, torch's SDPA formula, is.
    """
    registered = getattr(flop_counter, "flop_registry", {}).get(op)
    formula = getattr(registered, "__wrapped__", None)
    if formula is None:
        fallback = getattr(flop_counter, fallback_name, None)
        formula = getattr(fallback, "__wrapped__", fallback)
    return formula


def _extra_flop_formulas() -> dict:
    """FLOP formulas that FlopCounterMode needs for SDPA: the CPU kernel, and GQA on every kernel.

    * CPU: torch registers formulas only for the CUDA SDPA kernels, so without one for the CPU
      flash kernel (the one SDPA picks on CPU) FlopCounterMode silently counts zero attention
      FLOPs for attn "sdpa". Its shapes are those of the CUDA kernels, so torch's SDPA formulas
      apply.
    * GQA: transformers passes key/value with fewer heads than the query (enable_gqa=True), and
      torch's SDPA formulas up to 2.12 raise on that ("AssertionError: sdpa_flop_count:
      query/key/value shapes are incompatible"; SDPA may pick the cuDNN kernel), which left
      flop_counter_per_step null for every GQA model. Each SDPA kernel's formula is therefore
      wrapped to widen key/value to the query's heads before torch's own formula counts, which also
      keeps the count the same across torch versions.

    Flex attention is not wrapped: FlopCounterMode runs no formula for the uncompiled
    flex_attention higher-order op (it raises TypeError before any count), and torch 2.11 has no
    flex formula at all. Each op is looked up with hasattr: the set differs between torch versions.
    """
    from torch.utils import flop_counter

    aten = torch.ops.aten
    extra = {}
    for names, fallback, wrap in ((_SDPA_FORWARD_OPS, "sdpa_flop", _gqa_sdpa_flop),
                                  (_SDPA_BACKWARD_OPS, "sdpa_backward_flop",
                                   _gqa_sdpa_backward_flop)):
        for name in names:
            if not hasattr(aten, name):
                continue
            op = getattr(aten, name)
            formula = _torch_shape_formula(flop_counter, op, fallback)
            if formula is not None:
                extra[op] = wrap(formula)
    return extra


def flop_counter_step(model: torch.nn.Module, input_ids: torch.Tensor) -> float:
    """FLOPs of one forward + backward (labels = input_ids), as FlopCounterMode counts them.

    It counts matrix products only (mm, bmm, addmm, SDPA/flash/flex attention kernels); norms,
    activations, softmax and the loss are not counted, and attention products are counted in full
    (non-causal) even when causal. Compared with `flops_per_token(causal=False)` times the tokens:
    * lower by 6 FLOPs per token per norm weight (in N', but no matmul): under 0.1% for real
      models;
    * higher by 2*L*d*T per token when attention runs in a fused kernel (attn "sdpa" or
      "flex_attention"): torch's formula counts the Q @ K^T that the kernel's backward recomputes.
      Eager attention keeps the scores and has no recompute (docs/mfu.md has the figures).
    Without a formula for the CPU SDPA kernel, torch would count its attention as zero; this
    function supplies torch's own SDPA formulas for it, so CPU and GPU counts agree. Grouped-query
    attention is counted as the convention counts it, every query head against a full key and
    value (see `_extra_flop_formulas`), so GQA models compare the same way.

    It raises whatever the step raises under FlopCounterMode: uncompiled flex_attention does
    (torch 2.11: "TypeError: no implementation found for 'torch.ops.higher_order.flex_attention'"),
    so callers should record null for flop_counter_per_step when it raises, not fail the setup.

    The training state is left as it was: gradients present before the call are restored (None
    stays None), no optimizer step is taken, and the RNG state is restored so that dropout draws
    do not shift later steps. A torch.compile wrapper is unwrapped (its `_orig_mod` is counted):
    the model's FLOPs, not the compiled graph's.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = getattr(model, "_orig_mod", model)
    params = [p for p in model.parameters() if p.requires_grad]
    saved_grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    device = input_ids.device
    rng_devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices), \
                FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas()) as counter:
            loss = model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
        return float(counter.get_total_flops())
    finally:
        for p, grad in zip(params, saved_grads):
            p.grad = grad


# ----------------------------------------------------------------------------------------------
# MFU
# ----------------------------------------------------------------------------------------------

def achieved_tflops(flops_per_token_value: float | None, tokens_per_s: float | None) -> float | None:
    """flops_per_token * tokens_per_s in TFLOP/s; None when either is missing."""
    if flops_per_token_value is None or tokens_per_s is None:
        return None
    return flops_per_token_value * tokens_per_s / 1e12


def mfu(achieved_tflops_value: float | None, peak_tflops: float | None) -> float | None:
    """achieved / peak as a fraction (0.49 = 49%), or None.

    None when either number is missing or not positive, and None when the ratio is above 1.0: a
    model cannot do more FLOPs than the GPU's peak, so a value above 100% means the peak (wrong
    GPU entry, wrong dtype) or the FLOP count (wrong convention, wrong tokens) is wrong. It is not
    clamped to 1.0, which would hide that; callers should log a warning when they get None with
    both inputs present (`mfu_fields` does).
    """
    if achieved_tflops_value is None or peak_tflops is None:
        return None
    if achieved_tflops_value <= 0 or peak_tflops <= 0:
        return None
    ratio = achieved_tflops_value / peak_tflops
    return ratio if ratio <= 1.0 else None


def mfu_fields(*, config: Any, seq: int, tokens_per_s: float | None, gpu_name: str | None,
               dtype: str, params_non_embedding: int | None = None,
               peak_tflops_measured: float | None = None,
               warn=None) -> dict[str, Any]:
    """The result record's FLOP and MFU fields for one setup (see docs/results-schema.md).

    Returns flops_per_token, flops_per_token_causal, flops_convention, achieved_tflops,
    peak_tflops_datasheet, peak_tflops_measured, mfu_datasheet, mfu_measured. MFU uses the
    non-causal flops_per_token. `warn(message)` (default: logging) is called when an MFU would
    exceed 100% and is therefore left null.
    """
    if params_non_embedding is None:
        params_non_embedding = non_embedding_params(meta_model(config))
    per_token = flops_per_token(config, seq, params_non_embedding=params_non_embedding)
    per_token_causal = flops_per_token(config, seq, causal=True,
                                       params_non_embedding=params_non_embedding)
    achieved = achieved_tflops(per_token, tokens_per_s)
    peak_datasheet = datasheet_peak(gpu_name, dtype)
    fields = {
        "flops_per_token": per_token,
        "flops_per_token_causal": per_token_causal,
        "flops_convention": CONVENTION,
        "achieved_tflops": achieved,
        "peak_tflops_datasheet": peak_datasheet,
        "peak_tflops_measured": peak_tflops_measured,
        "mfu_datasheet": mfu(achieved, peak_datasheet),
        "mfu_measured": mfu(achieved, peak_tflops_measured),
    }
    for kind, peak in (("datasheet", peak_datasheet), ("measured", peak_tflops_measured)):
        if achieved is not None and peak and fields[f"mfu_{kind}"] is None and achieved > 0:
            message = (f"MFU against the {kind} peak would be {achieved / peak:.0%} "
                       f"({achieved:.1f} of {peak:.1f} TFLOP/s): the peak or the FLOP count is "
                       f"wrong; mfu_{kind} left null")
            if warn is None:
                import logging
                logging.getLogger(__name__).warning(message)
            else:
                warn(message)
    return fields
