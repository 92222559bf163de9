"""A config.json's values checked before any process starts (issue 37): transformers builds a
config from almost anything ("hidden_size": "big", 66 hidden with 4 heads) and the model then
fails to build inside every setup's process with a 30-line traceback. Here each such value is
one line naming the key and the fix, exit 2, before the plan runs (workload/checks.py reads
each config of a plan once). Presets are known good and not read; what transformers itself
rejects is left to workload/hf.build_config."""

from __future__ import annotations

import json

from stepbench.errors import UserError

# Sizes a causal LM's config gives as whole numbers above 0 (where it gives them at all).
POSITIVE_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings", "head_dim")
# Numbers above 0 where a config gives them (an epsilon of 0 divides by zero, a negative one
# transformers' own validation rejects with a traceback).
POSITIVE_NUMBERS = ("rms_norm_eps", "layer_norm_eps", "rope_theta")
# Probabilities: numbers from 0 to 1 (torch's dropout raises in every setup's first step else).
RATES = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")
# The keys a RoPE scaling goes under (rope_scaling before transformers 5, rope_parameters in it).
ROPE_KEYS = ("rope_scaling", "rope_parameters")
# The sizes that make a model's shape: a config that gives some of them and not the others gets
# transformers' defaults for the others (a 7B model's, for llama: intermediate_size 11008).
SHAPE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "vocab_size")


def check_values(model: str, data: dict) -> None:
    """UserError naming the key when a config's size is not a positive integer, a rate not a
    number, or the attention heads do not divide the hidden size (or the key-value heads the
    heads)."""
    for key in POSITIVE_INTS:
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value <= 0):
            raise UserError(f"{model}: {key} is {json.dumps(value)}, not a whole number above "
                            "0; fix the config")
    for key in (*POSITIVE_NUMBERS, *RATES, "initializer_range"):
        value = data.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise UserError(f"{model}: {key} is {json.dumps(value)}, not a number; fix the config")
        if value is not None and not _in_range(key, value):
            bounds = "from 0 to 1" if key in RATES else "above 0" if key in POSITIVE_NUMBERS \
                else "of 0 or more"
            raise UserError(f"{model}: {key} is {json.dumps(value)}, not a number {bounds}; "
                            "fix the config")
    for key in ROPE_KEYS:
        _check_rope(model, key, data.get(key))
    hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
    kv = data.get("num_key_value_heads")
    if hidden and heads and data.get("head_dim") is None and hidden % heads:
        raise UserError(f"{model}: hidden_size {hidden} is not a multiple of num_attention_heads "
                        f"{heads}; make it one (e.g. {hidden // heads * heads or heads}) or set "
                        "head_dim")
    if heads and kv and heads % kv:
        raise UserError(f"{model}: num_attention_heads {heads} is not a multiple of "
                        f"num_key_value_heads {kv}; fix the config")


def _in_range(key: str, value: float) -> bool:
    if key in RATES:
        return 0 <= value <= 1
    return value > 0 if key in POSITIVE_NUMBERS else value >= 0


def _check_rope(model: str, key: str, value) -> None:
    """A RoPE scaling is an object whose type is a name and whose factor (where it has one) is a
    number of 1 or more: transformers takes a factor below 1 with a warning. A key its type
    needs and lacks, and a type transformers does not know, are hf.build_config's checks."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise UserError(f"{model}: {key} is {json.dumps(value)}, not an object like "
                        '{"rope_type": "linear", "factor": 2.0}; fix the config')
    kind = value.get("rope_type", value.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise UserError(f"{model}: {key}'s rope_type is {json.dumps(kind)}, not a name; fix the "
                        "config")
    factor = value.get("factor")
    if "factor" in value and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                              or factor < 1):
        raise UserError(f"{model}: {key}'s factor is {json.dumps(factor)}, not a number of 1 or "
                        "more (it scales the positions); fix the config")


def defaulted_sizes(data: dict, cfg) -> list[str]:
    """The SHAPE sizes a config that gives some of them leaves to transformers' defaults, as
    `key default` (a key under the config class's own name counts as given: GPT-2's n_embd)."""
    aliases = getattr(cfg, "attribute_map", {}) or {}
    given = [key for key in SHAPE if key in data or aliases.get(key) in data]
    if not given:
        return []
    return [f"{key} {getattr(cfg, key)}" for key in SHAPE
            if key not in given and getattr(cfg, key, None) is not None]
