"""Per-layer compilation (compile scope "layer", and FSDP2's compiled layers) compiles every
decoder layer: each layer's KV-cache entry is guarded, so each layer is a graph of its own, and
past dynamo's recompile limit (8) the layers used to run eagerly without a word (the post's
24-layer model ran 8 layers compiled on the H200). In this process, with dynamo's eager backend:
what is checked is dynamo's choice to compile or to give up, which the backend does not change.
"""

import io

import pytest
from fakes import InProcess

from stepbench.execute.progress import Display
from stepbench.execute.runner import Runner
from stepbench.measure import compile_info
from stepbench.record import Machine, Record, ResultsFile
from stepbench.report.details import BEFORE_LAYER_GRAPHS
from stepbench.report.rows import build_rows
from stepbench.setup import Setup

LAYERS = 10


@pytest.fixture
def eager_backend(monkeypatch):
    """nn.Module.compile through dynamo's eager backend; dynamo's state fresh before and after."""
    # torch and dynamo imported by the compiling tests only: the fast loop collects this file.
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    original = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, *args, **kwargs: original(self, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=8):
        yield
    torch._dynamo.reset()
    counters.clear()


def deep_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=LAYERS, num_attention_heads=2,
                                        num_key_value_heads=2))


def one_step(model) -> dict:
    import torch

    tokens = torch.randint(0, 64, (2, 8))
    model(input_ids=tokens, labels=tokens).loss.backward()
    return compile_info.diagnostics(None, None, None, None)


@pytest.mark.slow     # compiles a 10-layer model with dynamo (~10-30 s)
def test_every_layer_past_dynamos_recompile_limit_is_compiled(eager_backend):
    from stepbench.measure import options      # imports torch

    compile_info.watch_recompile_limit()
    hits_before = compile_info.diagnostics(None, None, None, None)["recompile_limit_hits"]
    model = deep_model()
    options.compile_model(model, Setup(model="llama-tiny", mode="compile", attn="sdpa",
                                       compile_scope="layer", device="cpu"))
    info = one_step(model)
    assert info["graphs"] == LAYERS
    assert info["recompile_limit_hits"] == hits_before and info["break_reasons"] == []


@pytest.mark.slow     # compiles a 10-layer model with dynamo (~10-30 s)
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


def test_a_per_layer_record_from_before_the_fix_is_measured_again_and_replaced(tmp_path):
    """A stored per-layer compile record without `compile.recompile_limit_hits` (written when
    layers past the limit ran eagerly) is not resumed: the run measures it again, says so once,
    and the new record replaces it; whole-model and current per-layer records resume."""
    def tiny(**kw) -> Setup:
        return Setup(**{"model": "llama-tiny", "mode": "compile", "attn": "sdpa", "batch": 1,
                        "seq": 64, "device": "cpu", **kw})

    layer, whole, current = tiny(compile_scope="layer"), tiny(), tiny(compile_scope="layer", batch=2)
    out = ResultsFile(tmp_path / "r.jsonl")
    stored = {layer: {"graphs": 8}, whole: {"graphs": 1},
              current: {"graphs": 10, "recompile_limit_hits": 0}}
    for setup, compiled in stored.items():
        out.append(Record(run_id="old", repeat=0, setup=setup, status="ok", error=None,
                          step_ms=50.0, compile=compiled, machine=Machine(gpu="cpu")))
    assert [r.compiled_too_few_layers for r in out.read()] == [True, False, False]
    # A report of the old file marks that row (¶, a details cell, a reason in its JSON).
    rows = {row.setup.compile_scope + str(row.setup.batch): row
            for row in build_rows(out.read(), {})}
    assert [(rows[k].before_layer_fix, rows[k].compile_marked) for k in ("layer1", "model1")] \
        == [(True, True), (False, False)]
    assert rows["layer1"].as_dict()["break_reasons"] == [BEFORE_LAYER_GRAPHS]

    # A plan without that setup measures nothing and says nothing of it.
    executor, stream = InProcess(lambda job: [70.0, 70.0]), io.StringIO()
    Runner(executor, out).run([whole, current], repeats=1, timeout_s=60,
                              display=Display(stream, clock=lambda: 0.0))
    assert executor.ran == [] and "measured again" not in stream.getvalue()
    executor, stream = InProcess(lambda job: [70.0, 70.0]), io.StringIO()
    Runner(executor, out).run([layer, whole, current], repeats=1, timeout_s=60,
                              display=Display(stream, clock=lambda: 0.0))
    assert executor.ran == [(1, 0)]                        # the old per-layer record alone
    [said] = [line for line in stream.getvalue().splitlines() if "per-layer compile" in line]
    # The golden of the note on records measured again, word for word.
    assert said == ("stepbench: 1 stored record of per-layer compile measured again: written "
                    "before every decoder layer could have its own graph (layers past dynamo's "
                    "recompile limit ran eagerly)")
    latest = {r.setup: r for r in out.latest()}
    assert [latest[s].step_ms for s in (layer, whole, current)] == [70.0, 50.0, 50.0]
    assert len(out.read()) == 4                            # the old line stays in the file
