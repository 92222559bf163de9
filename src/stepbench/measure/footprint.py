"""The least memory a setup's training step can need, from its model's config alone (no torch).

`run` on a CPU refuses a setup whose estimate is above the memory the machine has available
before anything runs (cli/run.py), instead of letting its process grow until the kernel kills
it. The estimate is a floor, not a prediction: it counts only what a step must hold, so that a
setup that fits is never refused.

- weights and AdamW's two moments: 3 x parameters x the weights' bytes (fp32 master weights
  under autocast), held from step to step;
- then the larger of what the forward pass leaves for the backward pass (below) and the
  gradients (parameters x the weights' bytes), which the backward pass makes as it frees it:
- per token and layer, the inputs the layer's matrix products keep for the backward pass
  (2 x hidden + 2 x attention width + intermediate), and in eager mode also the attention's
  queries, keys and values, the MLP's gate and up projections and the norms' fp32 copies;
  with activation checkpointing, each layer's input alone;
- the logits (tokens x vocabulary), and in eager mode their fp32 copy and log-softmax, which
  the loss keeps;
- eager attention: every layer's attention probabilities (batch x heads x seq x seq; one layer's
  under checkpointing), and in eager mode the fp32 softmax of one layer.

How far below a step's measured peak the floor lies: docs/architecture.md, "Measured reasons".
"""

from __future__ import annotations

from dataclasses import dataclass

from stepbench.errors import UserError
from stepbench.measure.models import config_dict

# Bytes per element: (weights, computation) by precision.
BYTES = {"bf16": (2, 2), "fp16": (2, 2), "fp32": (4, 4), "autocast-bf16": (4, 2),
         "float8": (2, 2), "mixed-bf16": (4, 2)}


@dataclass(frozen=True)
class Footprint:
    """The floor of a step's memory, in bytes, by part."""

    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def _text(config: dict) -> dict:
    return config.get("text_config") or config


def params(config: dict) -> int | None:
    """Parameters of a decoder-only transformer of `config` (embeddings, attention, a gated MLP,
    two norms a layer); None where the config lacks a field this needs. A model with more (an
    MoE's experts, biases) has more: the count stays a floor."""
    c = _text(config)
    try:
        vocab, hidden, inter = c["vocab_size"], c["hidden_size"], c["intermediate_size"]
        layers, heads = c["num_hidden_layers"], c["num_attention_heads"]
    except KeyError:
        return None
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads") or heads
    per_layer = (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
                 + 3 * hidden * inter + 2 * hidden)
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return embeddings + layers * per_layer + hidden


def estimate(setup) -> Footprint | None:
    """The floor of `setup`'s step memory; None for a model whose config this cannot read."""
    try:
        config = config_dict(setup.model)
    except UserError:
        return None
    count = params(config)
    if count is None:
        return None
    c = _text(config)
    weight, compute = BYTES.get(setup.dtype, (2, 2))
    hidden, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads") or heads
    width = heads * head_dim
    eager = setup.mode == "eager"
    tokens = setup.batch * setup.seq
    if setup.checkpointing:
        per_token = layers * hidden * compute
    else:
        kept = 2 * hidden + 2 * width + inter
        if eager:
            kept += width + 2 * kv_heads * head_dim + 2 * inter
        per_token = layers * (kept * compute + (2 * hidden * 4 if eager else 0))
    logits = compute + ((4 if compute < 4 else 0) + 4 if eager else 0)
    forward = {"activations": tokens * per_token, "logits": tokens * c["vocab_size"] * logits}
    if setup.attn == "eager":
        scores = setup.batch * heads * setup.seq ** 2
        kept_layers = 1 if setup.checkpointing else layers
        forward["attention scores"] = scores * (kept_layers * compute + (4 if eager else 0))
    gradients = {"gradients": count * weight}
    held = {"weights and AdamW state": 3 * count * weight}
    return Footprint({**held, **max(forward, gradients, key=lambda p: sum(p.values()))})
