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
# Numbers (not strings) where a config gives them.
NUMBERS = ("rms_norm_eps", "layer_norm_eps", "rope_theta", "initializer_range",
           "attention_dropout")


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
    for key in NUMBERS:
        value = data.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise UserError(f"{model}: {key} is {json.dumps(value)}, not a number; fix the config")
    hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
    kv = data.get("num_key_value_heads")
    if hidden and heads and data.get("head_dim") is None and hidden % heads:
        raise UserError(f"{model}: hidden_size {hidden} is not a multiple of num_attention_heads "
                        f"{heads}; make it one (e.g. {hidden // heads * heads or heads}) or set "
                        "head_dim")
    if heads and kv and heads % kv:
        raise UserError(f"{model}: num_attention_heads {heads} is not a multiple of "
                        f"num_key_value_heads {kv}; fix the config")
