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
  (an H200 multiplies 8192^3 bf16 matrices at about 796 of its 989.4 TFLOP/s in a short burst,
  and about 680 once its power cap holds the clocks down).

Nothing here imports transformers at module level: the runner's parent process imports stepbench
without paying for it.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
from typing import Any

import torch

# ----------------------------------------------------------------------------------------------
# FLOPs per token: the formula
# ----------------------------------------------------------------------------------------------

CONVENTION = (
    "6*N' + 12*L*d*T per token (N' = parameters that take part in matmuls: all parameters "
    "except embedding lookups, with the output projection counted even when tied; L = layers; "
    "d = attention width, heads * head_dim; T = sequence length; non-causal attention; "
    "forward + backward = 3x forward)"
)
CONVENTION_CAUSAL = CONVENTION.replace("12*L*d*T", "6*L*d*T").replace(
    "non-causal attention", "causal attention, half the score matrix")


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
    """Training FLOPs per token, forward + backward, by `CONVENTION` (or `CONVENTION_CAUSAL`).

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
      query/key/value shapes are incompatible"; on an H200 with torch 2.11 SDPA picks the cuDNN
      kernel), which left flop_counter_per_step null for every GQA model. Each SDPA kernel's
      formula is therefore wrapped to widen key/value to the query's heads before torch's own
      formula counts, which also keeps the count the same across torch versions.

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
      Eager attention keeps the scores and has no recompute. For the post's model at T=2048 that
      is +3.1%.
    Without a formula for the CPU SDPA kernel, torch would count its attention as zero; this
    function supplies torch's own SDPA formulas for it, so CPU and GPU counts agree. Grouped-query
    attention is counted as the convention counts it, every query head against a full key and
    value (see `_extra_flop_formulas`), so GQA models compare the same way. Measured on
    the H200 for the post's model (1 x 2048, bf16): eager 0.9999 and sdpa 1.0312 times the
    convention.

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
# Peaks: datasheet
# ----------------------------------------------------------------------------------------------

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU and dtype, keyed by the name NVML and
# torch.cuda.get_device_name() report. Source: the vendor's datasheet or architecture
# whitepaper; where the datasheet gives only "with sparsity" figures they are halved.
#   bf16 / fp16: tensor cores, FP32 accumulate (what PyTorch's matmuls use). GeForce cards run
#                FP32 accumulate at half their FP16-accumulate rate, so their entries are the
#                smaller number (RTX 4090: 165.2, not 330.3).
#   tf32:        tensor cores on fp32 tensors (torch.set_float32_matmul_precision("high")).
#   fp32:        CUDA cores, no tensor cores: plain fp32 matmuls under torch's default precision.
# A dtype the GPU has no fast path for is None. Left out on purpose: the A10G (an AWS variant
# with no NVIDIA datasheet; published figures disagree), and any GPU whose number we could not
# tie to a vendor document. A missing GPU gives mfu_datasheet = null, never a guess.
_H100_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}    # H100 whitepaper / datasheet
_H100_PCIE = {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}   # datasheet: 1513 / 756 sparse
_HOPPER_NVL = {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}  # datasheet: 1671 / 835 sparse
_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}        # A100 datasheet, all forms

DATASHEET_PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    # Hopper
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _HOPPER_NVL,
    "NVIDIA H200": _H100_SXM,            # H200 SXM datasheet: same compute as H100 SXM
    "NVIDIA H200 NVL": _HOPPER_NVL,      # H200 NVL datasheet: 1671 / 835 sparse, FP32 60
    # Blackwell (HGX B200 datasheet, per GPU at 1000 W: BF16 4.5 PF, TF32 2.2 PF sparse; FP32 75)
    "NVIDIA B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0},
    # Ampere data center
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},   # A10 datasheet
    # Ada data center (L40S / L40 / L4 datasheets; the L40 is rated at half the L40S tensor rate)
    "NVIDIA L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "NVIDIA L40": {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
    "NVIDIA L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    # Workstation (datasheets; FP32 accumulate runs at full rate on these)
    "NVIDIA RTX A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "NVIDIA RTX 6000 Ada Generation": {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
    # GeForce (architecture whitepapers, "with FP32 accumulate" rows)
    "NVIDIA GeForce RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "NVIDIA GeForce RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "NVIDIA GeForce RTX 5090": {"bf16": 209.5, "fp16": 209.5, "tf32": 104.8, "fp32": 104.8},
    # Volta (V100 datasheet): no bf16 or tf32 tensor cores
    "Tesla V100-SXM2-16GB": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "Tesla V100-SXM2-32GB": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "Tesla V100-PCIE-16GB": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "Tesla V100-PCIE-32GB": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "Tesla V100S-PCIE-32GB": {"bf16": None, "fp16": 130.0, "tf32": None, "fp32": 16.4},
}

# Other spellings people type or tools print, for the fuzzy match. Only names that pick one
# entry: "H100" alone is left out because SXM, PCIe and NVL differ by 30%.
_ALIASES: dict[str, str] = {
    "H100 SXM": "NVIDIA H100 80GB HBM3",
    "H100 SXM5": "NVIDIA H100 80GB HBM3",
    "H200 SXM": "NVIDIA H200",
    "A100": "NVIDIA A100-SXM4-80GB",          # every A100 has the same peaks
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation",
    "V100 SXM2": "Tesla V100-SXM2-16GB",
    "V100 PCIe": "Tesla V100-PCIE-16GB",
    "V100S": "Tesla V100S-PCIE-32GB",
}

# Words that do not tell two entries apart: the vendor, the brand, memory sizes.
_NOISE_TOKENS = {"nvidia", "geforce", "tesla", "generation"}
# Extra words a query may carry beyond an entry's own words and still match it: form factors
# and memory kinds, which the entry's own name may leave out ("NVIDIA H200" vs "H200 SXM 141GB").
_QUALIFIER_TOKENS = {"sxm", "sxm2", "sxm4", "sxm5", "sxm6", "pcie", "hbm2", "hbm2e", "hbm3",
                     "hbm3e", "gddr6", "gddr6x", "gddr7"}

DTYPES = ("bf16", "fp16", "tf32", "fp32")
_DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
                "half": "fp16", "tf32": "tf32", "fp32": "fp32", "float32": "fp32", "float": "fp32"}


def normalize_dtype(dtype: str | torch.dtype) -> str:
    """'bf16', 'fp16', 'tf32' or 'fp32' for a name or torch dtype; ValueError names the choices."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    return _DTYPE_NAMES[name]


def _tokens(name: str) -> frozenset[str]:
    words = re.split(r"[^a-z0-9]+", name.lower())
    return frozenset(w for w in words
                     if w and w not in _NOISE_TOKENS and not re.fullmatch(r"\d+gb", w))


_MATCH_KEYS: list[tuple[frozenset[str], str]] = (
    [(_tokens(name), name) for name in DATASHEET_PEAK_TFLOPS]
    + [(_tokens(alias), name) for alias, name in _ALIASES.items()])


def datasheet_entry(gpu_name: str) -> str | None:
    """The DATASHEET_PEAK_TFLOPS key for `gpu_name`, or None when unknown or ambiguous.

    Exact name first. Otherwise the name's words (lower case, split on anything not a letter or
    digit, without "NVIDIA", "GeForce", "Tesla" and memory sizes like "80GB") must contain all the
    words of an entry or alias, and any extra words must be form factors or memory kinds
    ("SXM5", "PCIe", "HBM3"). "h100 pcie" and "NVIDIA H100-SXM5-80GB" match; "NVIDIA GeForce RTX
    4090 D" (a different, smaller chip) and "GH200" do not. The entry with the most words wins;
    a tie between entries with different peaks gives None rather than a guess.
    """
    if gpu_name in DATASHEET_PEAK_TFLOPS:
        return gpu_name
    query = _tokens(gpu_name)
    if not query:
        return None
    candidates = [(len(key), name) for key, name in _MATCH_KEYS
                  if key <= query and (query - key) <= _QUALIFIER_TOKENS]
    if not candidates:
        return None
    best = max(size for size, _ in candidates)
    names = {name for size, name in candidates if size == best}
    peaks = {tuple(sorted(DATASHEET_PEAK_TFLOPS[n].items(), key=lambda kv: kv[0])) for n in names}
    if len(peaks) > 1:
        return None
    return sorted(names)[0]


def datasheet_peak(gpu_name: str | None, dtype: str | torch.dtype) -> float | None:
    """Dense datasheet peak TFLOP/s of `gpu_name` for `dtype` (see DATASHEET_PEAK_TFLOPS).

    None for an unknown GPU, "cpu", or a dtype the GPU has no tensor-core or datasheet figure for.
    """
    if not gpu_name:
        return None
    entry = datasheet_entry(gpu_name)
    if entry is None:
        return None
    return DATASHEET_PEAK_TFLOPS[entry].get(normalize_dtype(dtype))


# ----------------------------------------------------------------------------------------------
# Peaks: measured
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _float32_matmul_precision(dtype: str):
    # fp32 must mean CUDA cores (to match the datasheet's fp32 row) and tf32 tensor cores,
    # whatever the caller set; restored afterwards. set_float32_matmul_precision is the one API
    # that works with both of torch's TF32 switches (mixing allow_tf32 and fp32_precision raises).
    old = torch.get_float32_matmul_precision()
    if dtype in ("fp32", "tf32"):
        torch.set_float32_matmul_precision("highest" if dtype == "fp32" else "high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                 "fp32": torch.float32}


def measure_matmul_tflops(device: str | torch.device = "cuda", dtype: str | torch.dtype = "bf16",
                          n: int | None = None, repeats: int | None = None, *,
                          sustained_s: float = 0.0) -> float:
    """The device's dense matmul rate in TFLOP/s: median over `repeats` timed n x n x n products.

    Random normal inputs, not zeros (zeros run faster on some GPUs: 894 vs 788 TFLOP/s on an
    H200). n defaults to 8192 on CUDA (1.1 TFLOP per product) and 1024 on CPU; repeats to 20 on
    CUDA, 5 on CPU.

    On CUDA, by default this is the burst rate at full boost clock, measured as the anchors
    measured their 796 TFLOP/s: a few warm-up products (cuBLAS picks its kernel, clocks leave
    idle), then each repeat timed between its own pair of CUDA events (a repeat is one product, or
    as many back-to-back products as make 1 ms when n is small), one synchronize at the end. At
    n=8192 that is about 35 ms of load, too short for the power limit to act. Under sustained
    load a GPU settles at its power cap: on the H200, 0.2 s of back-to-back bf16 products reach
    the 700 W cap and the rate falls from about 800 to about 680 TFLOP/s. `sustained_s` > 0 runs
    that many seconds of products before timing and so measures the power-capped rate instead.
    Keep n large on a fast GPU: products launched one by one from Python cannot keep an H200
    busy below n of a few thousand (n=1024 gave 113 TFLOP/s there). On CPU: one warm-up product,
    then perf_counter around each product.
    """
    dev = torch.device(device)
    dt = normalize_dtype(dtype)
    if dt == "tf32" and dev.type != "cuda":
        raise ValueError("tf32 is a CUDA tensor-core mode; use fp32 on cpu")
    cuda = dev.type == "cuda"
    n = n or (8192 if cuda else 1024)
    repeats = repeats or (20 if cuda else 5)
    if n <= 0 or repeats <= 0 or sustained_s < 0:
        raise ValueError(f"n and repeats must be positive and sustained_s not negative, got "
                         f"n={n}, repeats={repeats}, sustained_s={sustained_s}")
    generator = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=_TORCH_DTYPES[dt], generator=generator)
    b = torch.randn(n, n, device=dev, dtype=_TORCH_DTYPES[dt], generator=generator)
    out = torch.empty_like(a)
    flop_per_matmul = 2.0 * n ** 3
    with _float32_matmul_precision(dt):
        if cuda:
            seconds_per_matmul = _median_cuda_seconds(a, b, out, repeats, sustained_s)
        else:
            seconds_per_matmul = _median_cpu_seconds(a, b, out, repeats)
    return flop_per_matmul / seconds_per_matmul / 1e12


def _median_cuda_seconds(a, b, out, repeats: int, sustained_s: float) -> float:
    def products(count: int) -> float:
        """Run `count` products, synchronized; return their host-clock seconds."""
        torch.cuda.synchronize(a.device)
        start = time.perf_counter()
        for _ in range(count):
            torch.mm(a, b, out=out)
        torch.cuda.synchronize(a.device)
        return time.perf_counter() - start

    products(1)                          # cuBLAS handle, workspace and kernel choice
    per_matmul_s = products(3) / 3       # clocks ramp up from idle; also sizes the batch below
    if sustained_s > 0:
        start = time.perf_counter()
        while time.perf_counter() - start < sustained_s:
            products(8)
    # At least 1 ms per timed repeat, so that launch gaps and event resolution do not count for
    # small n; large n time one product per repeat.
    batch = max(1, min(1000, math.ceil(0.001 / max(per_matmul_s, 1e-9))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for begin, end in events:
        begin.record()
        for _ in range(batch):
            torch.mm(a, b, out=out)
        end.record()
    torch.cuda.synchronize(a.device)
    return statistics.median(begin.elapsed_time(end) / 1e3 / batch for begin, end in events)


def _median_cpu_seconds(a, b, out, repeats: int) -> float:
    torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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
                logging.getLogger("stepbench.flops").warning(message)
            else:
                warn(message)
    return fields
