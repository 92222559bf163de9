"""The axes beyond mode, attention and batch, each value run for real on the CPU (or recorded as
unsupported with its reason), and the loss guard on what they produced.

One matrix of real child processes (llama-tiny, 4 x 32 tokens, 1 warm-up and 2 timed steps)
through the runner that `stepbench run` uses: the eager reference, autocast-bf16, fp32,
activation checkpointing with foreach AdamW, one compiled setup (compile scope "layer"; the
CUDA-graph modes need a GPU, see benchmarks/README.md section e), the values this machine
cannot run (float8 here; liger-kernel and flash attention are refused by the same check, tested
in this process), and one setup whose weights the tests' hook spoils (tests/hooks), so that its
loss departs.
"""

import json
import os

import pytest

from stepbench.execute.local.process import LocalProcess
from stepbench.execute.runner import Runner
from stepbench.report.findings import WRONG_LOSS
from stepbench.guard import DEPARTS, OK, REFERENCE, loss_verdicts
from stepbench.record import ResultsFile
from stepbench.report.document import rows_document
from stepbench.report.render import render
from stepbench.report.rows import build_rows
from stepbench.setup import Setup

from conftest import DIVERGE_ENV, with_hooks
from says import names

BASE = dict(model="llama-tiny", device="cpu", batch=4, seq=32, warmup=1, steps=2)


def setup(mode="eager", attn="sdpa", **options) -> Setup:
    return Setup(mode=mode, attn=attn, **BASE, **options).check()


REFERENCE_SETUP = setup()
RUNS = [
    REFERENCE_SETUP,
    setup(dtype="autocast-bf16"),
    setup(dtype="fp32"),
    setup(checkpointing=True, optimizer="foreach"),
    setup("compile", compile_scope="layer"),
    setup(attn="eager"),                     # spoiled by the test hook: its loss departs
]
UNSUPPORTED = {
    setup(dtype="float8"): "float8 training needs a CUDA GPU",
    setup(kernels="liger"): "liger-kernel's Triton kernels need a CUDA GPU",
    setup(kernels="liger-no-flce"): "liger-kernel's Triton kernels need a CUDA GPU",
    setup(attn="flash_attention_2"): "flash_attention_2 runs on a CUDA GPU only",
    setup(attn="flash_attention_3"): "flash_attention_3 runs on a CUDA GPU only",
}
# The one unsupported value that goes through a real child (the others take the same path: the
# child's check, then the worker's classification; both are run for each of them below).
UNSUPPORTED_RUN = setup(dtype="float8")
SPOILED = setup(attn="eager")


@pytest.fixture(scope="module")
def axes_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("axes") / "results.jsonl"
    # Through the process server, as `run` starts setups: the tests' hook reaches its children.
    executor = LocalProcess(start="server", preload={"models": [["llama-tiny", 32]],
                                                     "compile": True})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", with_hooks(os.environ)["PYTHONPATH"])
        mp.setenv(DIVERGE_ENV, SPOILED.name)
        try:
            records = Runner(executor, ResultsFile(out)).run(RUNS + [UNSUPPORTED_RUN],
                                                             timeout_s=300)
        finally:
            executor.close()
    return out, {r.setup: r for r in records}


@pytest.mark.slow
def test_each_value_runs_or_is_unsupported_with_its_reason(axes_run):
    _, by_setup = axes_run
    for s in RUNS:
        record = by_setup[s]
        assert record.status == "ok", (s.name, record.error)
        assert len(record.losses) == 1 + s.warmup + s.steps and record.step_ms > 0
    record = by_setup[UNSUPPORTED_RUN]
    assert record.status == "unsupported", (record.setup.name, record.status, record.error)
    assert names(record.error, UNSUPPORTED[UNSUPPORTED_RUN], "--device cuda")
    assert record.software.torch and record.machine.gpu == "cpu"


@pytest.mark.parametrize("s", list(UNSUPPORTED), ids=lambda s: f"{s.attn}-{s.dtype}-{s.kernels}")
def test_each_value_this_machine_cannot_run_is_refused_with_its_reason(s):
    # What the child does before it builds anything (measure/step.py build), and how the worker
    # classifies what it raised: the same path as UNSUPPORTED_RUN's real child above.
    from stepbench.measure.options import Unsupported, check_supported
    from stepbench.measure.worker import classify_exception

    with pytest.raises(Unsupported) as caught:
        check_supported(s)
    status, error = classify_exception(caught.value)
    assert status == "unsupported"
    assert names(error, UNSUPPORTED[s], "--device cuda")


@pytest.mark.slow
def test_the_same_weights_give_the_same_first_loss_whatever_the_options(axes_run):
    _, by_setup = axes_run
    first = [by_setup[s].loss_first for s in RUNS if s != SPOILED]
    assert max(first) - min(first) < 1e-3 * first[0], first
    assert by_setup[SPOILED].loss_first > 3 * first[0]


@pytest.mark.slow
def test_per_layer_compilation_compiles_the_layers(axes_run):
    _, by_setup = axes_run
    compiled = by_setup[RUNS[4]]
    assert compiled.setup.name == "compile/layer+sdpa"
    assert compiled.compile["graphs"] >= 1 and compiled.compile["recompiles_in_timed"] == 0
    assert compiled.flop_counter_per_step, "the FLOP count runs the compiled layers eagerly"


@pytest.mark.slow
def test_new_fields_are_written_only_when_set(axes_run):
    out, _ = axes_run
    written = {json.dumps(r["setup"], sort_keys=True) for r in map(json.loads, out.read_text().splitlines())}
    plain = next(json.loads(w) for w in written if json.loads(w)["name"] == "eager+sdpa"
                 and json.loads(w)["dtype"] == "bf16")
    assert not {"compile_scope", "kernels", "checkpointing", "optimizer"} & set(plain)
    ckpt = next(json.loads(w) for w in written if json.loads(w)["name"] == "eager+sdpa+ckpt+foreach")
    assert ckpt["checkpointing"] is True and ckpt["optimizer"] == "foreach"
    # ... and every record reads back as the setup that ran (resume finds them).
    assert {r.setup for r in ResultsFile(out).read()} == set(RUNS) | {UNSUPPORTED_RUN}


@pytest.mark.slow
def test_the_loss_guard_flags_the_spoiled_setup_and_passes_the_real_ones(axes_run):
    out, by_setup = axes_run
    records = ResultsFile(out).read()
    verdicts = loss_verdicts(records)
    by_name = {s: verdicts[(s.key(), "cpu")] for s in RUNS}
    assert by_name[REFERENCE_SETUP].status == REFERENCE
    assert by_name[SPOILED].status == DEPARTS and by_name[SPOILED].reference == "eager+sdpa"
    for s in RUNS:
        if s not in (REFERENCE_SETUP, SPOILED):
            assert by_name[s].status == OK, (s.name, by_name[s])
    # Curves where the weights share a dtype; the first loss alone across bf16 and fp32 weights.
    # (autocast-bf16 against bf16, then fp32 against autocast-bf16: each chain ends at eager+sdpa).
    assert by_name[RUNS[4]].steps == 4
    assert by_name[RUNS[1]].steps == 1 and by_name[RUNS[1]].reference == "eager+sdpa (bf16)"
    assert by_name[RUNS[2]].steps == 4
    assert by_name[RUNS[2]].reference == "eager+sdpa (autocast-bf16)"
    assert {k for k, v in loss_verdicts(records).items() if v.departs} == {(SPOILED.key(), "cpu")}
    assert all(r.loss_tolerance == (1e-4 if r.setup.dtype == "fp32" else 2e-2 if
                                    r.setup.dtype != "float8" else 5e-2) for r in records)


@pytest.mark.slow
def test_the_report_marks_the_departing_setup_and_never_calls_it_fastest(axes_run):
    out, by_setup = axes_run
    doc = rows_document(build_rows(ResultsFile(out).read(), {}))
    text = render(doc, "markdown")
    assert names(text, "loss guard", "eager+eager", "first loss")
    # One departure; the other workloads' loss_guard findings say their setups agreed.
    guard = [f for _, found in doc.findings for f in found if f.kind == "loss_guard"
             and WRONG_LOSS in f.tags]
    assert len(guard) == 1 and "eager+eager" in guard[0].text
    assert doc.lead[0][1] is guard[0]
    fastest = [f.text for _, found in doc.findings for f in found if f.kind == "fastest_setup"]
    untested = [f.text for _, found in doc.findings for f in found if f.kind == "untested"]
    # (Where other processes took the CPUs from both of the two fastest, `busy_cpu`, they are
    # listed as untested instead: report/findings/caveats.py.)
    assert (fastest or untested) and all("eager+eager" not in t for t in fastest)
    rows = json.loads(render(doc, "json"))["rows"]
    assert {r["setup"]: r["loss_guard"] for r in rows if r["dtype"] == "bf16"
            and r["status"] == "ok"}["eager+eager"] == "departs"
