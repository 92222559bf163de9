"""Per-layer compilation (compile scope "layer", and FSDP2's compiled layers) compiles every
decoder layer: each layer's KV-cache entry is guarded, so each layer is a graph of its own, and
past dynamo's recompile limit (8) the layers used to run eagerly without a word (the post's
24-layer model ran 8 layers compiled on the H200). In this process, with dynamo's eager backend:
what is checked is dynamo's choice to compile or to give up, which the backend does not change.
"""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM

from stepbench.measure import compile_info, options
from stepbench.setup import Setup

LAYERS = 10


@pytest.fixture
def eager_backend(monkeypatch):
    """nn.Module.compile through dynamo's eager backend; dynamo's state fresh before and after."""
    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, *args, **kwargs: original(self, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=8):
        yield
    torch._dynamo.reset()
    counters.clear()


def deep_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=LAYERS, num_attention_heads=2,
                                        num_key_value_heads=2))


def one_step(model) -> dict:
    tokens = torch.randint(0, 64, (2, 8))
    model(input_ids=tokens, labels=tokens).loss.backward()
    return compile_info.diagnostics(None, None, None, None)


def test_every_layer_past_dynamos_recompile_limit_is_compiled(eager_backend):
    compile_info.watch_recompile_limit()
    hits_before = compile_info.diagnostics(None, None, None, None)["recompile_limit_hits"]
    model = deep_model()
    options.compile_model(model, Setup(model="llama-tiny", mode="compile", attn="sdpa",
                                       compile_scope="layer", device="cpu"))
    info = one_step(model)
    assert info["graphs"] == LAYERS
    assert info["recompile_limit_hits"] == hits_before and info["break_reasons"] == []


def test_layers_left_eager_at_the_limit_are_counted_and_said(eager_backend):
    # What per-layer compilation did before it raised the limit: the same layers, compiled one
    # by one at dynamo's default limit.
    compile_info.watch_recompile_limit()
    hits_before = compile_info.diagnostics(None, None, None, None)["recompile_limit_hits"]
    model = deep_model()
    for layer in model.model.layers:
        layer.compile()
    info = one_step(model)
    assert info["graphs"] == 8
    assert info["recompile_limit_hits"] > hits_before
    assert any("recompile limit hit" in reason for reason in info["break_reasons"])
