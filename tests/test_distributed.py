"""Distributed jobs through torchrun on the CPU (gloo): DDP and FSDP2 of the tiny model give one
record each with every rank's numbers, and a rank that fails takes its job down whole, says which
rank it was, and leaves the rest of the matrix running and no process behind.

Each job starts torchrun and two rank processes that import torch and transformers: about 20 s
on two cores, so the tests are few and eager (the compiled path is the same code; the GPU run in
benchmarks/README.md covers it).
"""

import gzip
import json
import os
import random
from pathlib import Path

import psutil
import pytest

from stepbench.cli import main

from conftest import FAULT_ENV, read_jsonl, run_cli, with_hooks
from says import lines_naming, names, table_rows

TINY = ["--device", "cpu", "--model", "llama-tiny", "--seq", "64", "--warmup", "1", "--steps", "2",
        "--modes", "eager", "--attn", "sdpa", "--repeats", "1"]


@pytest.mark.slow
def test_ddp_and_fsdp2_jobs_of_two_gloo_processes_give_one_record_each(tmp_path, capsys):
    out, traces = tmp_path / "r.jsonl", tmp_path / "traces"
    proc = run_cli("run", *TINY, "--nproc", "2", "--parallel", "none,ddp,fsdp2", "--out", out,
                   "--profile", traces, "--format", "json", check_json=True)
    single, ddp, fsdp2 = proc.records
    assert [r["setup"].get("parallel", "none") for r in proc.records] == ["none", "ddp", "fsdp2"]
    assert "nproc" not in single["setup"] and ddp["setup"]["nproc"] == 2
    assert any(names(line, "[2/3]", "eager+sdpa batch 4 seq 64 ddp x2", ": ok")
               for line in proc.stderr.splitlines())
    for job in (ddp, fsdp2):
        assert job["status"] == "ok", job["error"]
        ranks = job["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(len(r["step_times_ms"]) == 2 and r["peak_memory_gb"] > 0 for r in ranks)
        # The job's step ends with its slowest rank; tokens count the global batch.
        slowest = max(ranks, key=lambda r: r["step_ms"])
        assert job["step_ms"] == slowest["step_ms"] and job["step_times_ms"] == slowest["step_times_ms"]
        assert job["tokens_per_s"] == pytest.approx(4 * 64 * 2 / (job["step_ms"] / 1000))
        assert job["peak_memory_gb"] == max(r["peak_memory_gb"] for r in ranks)
        scaling = job["scaling"]
        assert scaling["world_size"] == 2 and scaling["backend"] == "gloo"
        assert scaling["slowest_rank"] == slowest["rank"]
        assert scaling["tokens_per_s_per_gpu"] == pytest.approx(job["tokens_per_s"] / 2)
        # The baseline ran first into the same file: efficiency is in the record, and says which.
        assert scaling["baseline"]["run_id"] == single["run_id"]
        assert scaling["efficiency"] == pytest.approx(scaling["tokens_per_s_per_gpu"] / single["tokens_per_s"])
        # Same seed: rank 0 starts from the single process's weights and tokens; rank 1 trains
        # tokens of its own (data parallel).
        assert ranks[0]["loss_first"] == pytest.approx(single["loss_first"], rel=1e-6)
        assert ranks[1]["loss_first"] != pytest.approx(ranks[0]["loss_first"], rel=1e-4)
    # DDP and FSDP2 average the same gradients: the same model after the same steps.
    assert ddp["ranks"][0]["loss_last"] == pytest.approx(fsdp2["ranks"][0]["loss_last"], rel=2e-2)
    assert ddp["params"] == fsdp2["params"] == single["params"]

    assert main(["report", str(out), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "Details: scaling" in text and "compile+sdpa" not in text and "eager+sdpa (ddp x2)" in text
    assert main(["report", str(out), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    by_parallel = {r["parallel"]: r for r in rows}
    assert by_parallel["ddp"]["scaling_efficiency"] == pytest.approx(
        by_parallel["ddp"]["tokens_per_s_per_gpu"] / by_parallel["none"]["tokens_per_s"])
    assert "1 process" in by_parallel["fsdp2"]["scaling_baseline"]

    # FSDP2's wrapping choices, all at once, into the same file: its mixed precision on fp32
    # weights, layers kept gathered from the forward to the backward, both layers in one unit,
    # explicit prefetching.
    proc = run_cli("run", *TINY, "--nproc", "2", "--parallel", "fsdp2", "--precision", "mixed-bf16",
                   "--fsdp-reshard", "off", "--fsdp-unit", "2", "--fsdp-prefetch", "on", "--out", out,
                   "--profile", traces, "--format", "json", check_json=True)
    (mixed,) = proc.records
    assert mixed["status"] == "ok", mixed["error"]
    assert mixed["setup"]["name"] == "eager+sdpa+no-reshard+unit2+prefetch"
    assert (mixed["setup"]["dtype"], mixed["setup"]["fsdp_reshard"], mixed["setup"]["fsdp_unit"],
            mixed["setup"]["fsdp_prefetch"]) == ("mixed-bf16", False, 2, True)
    # Its baseline is one process in bf16; its first forward runs on bf16 copies of the same
    # fp32 weights as the bf16 job's, and training on fp32 master weights moves apart after.
    assert mixed["scaling"]["baseline"]["run_id"] == single["run_id"]
    assert mixed["ranks"][0]["loss_first"] == pytest.approx(fsdp2["ranks"][0]["loss_first"], rel=1e-3)
    assert mixed["losses"] != fsdp2["losses"]

    # Every process of a job profiled one more step; the traces show the wrapping at work: a
    # layer resharded after its forward is gathered twice a step, a kept one once; a unit of two
    # layers is gathered as one; explicit prefetching has spans of its own.
    def fsdp_events(record, rank=0):
        trace = Path(record["profile"]["trace"])
        assert trace.name.endswith(f"_rank{rank}.json.gz") and trace.parent == traces
        events = json.load(gzip.open(trace))["traceEvents"]
        return [e["name"] for e in events if e.get("name", "").startswith("FSDP::")]

    assert fsdp_events(ddp) == []
    for record, unit, gathers, prefetch in ((fsdp2, "model.layers.0", 2, False),
                                            (mixed, "model.layers.0, model.layers.1", 1, True)):
        events = fsdp_events(record)
        assert events.count(f"FSDP::all_gather ({unit})") == gathers, events
        assert events.count("FSDP::all_gather (model.layers.1)") == (2 if record is fsdp2 else 0)
        assert any(n.startswith("FSDP::forward_prefetch") for n in events) is prefetch
        assert fsdp_events({"profile": {"trace": record["profile"]["trace"].replace("_rank0", "_rank1")}}, 1)
        table = Path(record["profile"]["table"]).read_text()
        assert table.startswith("# ") and names(table.splitlines()[0], "training step",
                                                "key_averages", "cpu_time_total")
        assert record["profile"]["device_s"] is None and record["profile"]["step_s"] > 0
        assert "aten::mm" in table and "FSDP::pre_forward" in table
    assert Path(single["profile"]["trace"]).exists() and "_rank" not in single["profile"]["trace"]

    assert main(["report", str(out), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    # the job's wrapping, in the cell after its processes'
    assert any("fsdp2 x2" in row and names(row[row.index("fsdp2 x2") + 1], "per 2 layers + root",
                                           "no reshard", "explicit prefetch", "fp32 params",
                                           "bf16 compute", "fp32 reduce", "optimizer on DTensors")
               for row in table_rows(text))
    assert names(text, "eager+sdpa (bf16), 1 process", "1 run")

    # Jobs of one process (FSDP2 at world size 1), with a foreach AdamW over the local shards
    # and over the DTensors: the same first loss as one process without a wrapper; no fused
    # baseline stands in for them. Both optimizers do the same arithmetic: equal losses.
    proc = run_cli("run", *TINY, "--nproc", "1", "--parallel", "fsdp2", "--optimizer", "foreach",
                   "--fsdp-optimizer", "local,dtensor", "--steps", "4", "--out", out,
                   "--format", "json", check_json=True)
    local, dtensor = proc.records
    assert "fsdp_optimizer" not in fsdp2["setup"] and local["setup"]["fsdp_optimizer"] == "local"
    assert (local["setup"]["name"], dtensor["setup"]["name"]) == ("eager+sdpa+foreach+local-optim",
                                                                "eager+sdpa+foreach")
    for alone in (local, dtensor):
        assert alone["status"] == "ok", alone["error"]
        assert "nproc" not in alone["setup"]
        assert [r["rank"] for r in alone["ranks"]] == [0] and alone["scaling"]["world_size"] == 1
        assert alone["scaling"]["baseline"] is None
        assert alone["loss_first"] == pytest.approx(single["loss_first"], rel=1e-6)
    assert len(local["losses"]) == 1 + 1 + 4 and local["losses"] == dtensor["losses"]
    assert local["losses"][-1] < local["losses"][0]      # the local shards were trained


def _leftovers(marker: str) -> list:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_a_rank_that_raises_ends_its_job_names_the_rank_and_the_matrix_goes_on(tmp_path,
                                                                              monkeypatch):
    out = tmp_path / "r.jsonl"
    # A seed no other test uses marks this run's processes (it is in every rank's command line);
    # drawn at random, so that a suite running beside this one (another checkout's) never shares it.
    seed = str(random.SystemRandom().randrange(10**6, 10**9))
    monkeypatch.setenv("PYTHONPATH", with_hooks(os.environ)["PYTHONPATH"])
    monkeypatch.setenv(FAULT_ENV, "1:raise:warmup")
    proc = run_cli("run", *TINY, "--seed", seed, "--nproc", "2", "--parallel", "ddp,none",
                   "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stderr
    single, failed = read_jsonl(out)        # none first, whatever the order given
    assert failed["setup"]["parallel"] == "ddp" and "parallel" not in single["setup"]
    assert failed["status"] == "error" and failed["phase"] == "warmup"
    assert failed["error"].startswith("rank 1 (")
    assert names(failed["error"], "fault injected", "rank 1", "phase warmup", "torchrun")
    # The error ends with the failing rank's own traceback, not torchrun's summary.
    assert names(failed["error"].rstrip().splitlines()[-1], "phase warmup")
    assert single["status"] == "ok"          # the rest of the matrix went on
    assert _leftovers(f'"seed": {seed}') == []


def test_the_report_of_real_two_gpu_jobs_pays_for_every_gpu_and_shows_scaling(tmp_path, capsys):
    # The H200 x2 run committed under benchmarks/results (section e of benchmarks/README.md).
    path = Path(__file__).parent.parent / "benchmarks/results/h200x2-2026-12-01-one-gpu-ddp-fsdp2.jsonl"
    assert main(["report", str(path), "--price", "NVIDIA H200=3.5", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    single = {r["setup"]: r for r in rows if r["parallel"] == "none"}
    for row in (r for r in rows if r["parallel"] != "none"):
        assert row["gpus"] == 2
        # Two GPUs at 3.50 $/h each: the job's tokens per dollar of both.
        assert row["m_tokens_per_dollar"] == pytest.approx(row["tokens_per_s"] * 3600 / 7.0 / 1e6)
        base = single[row["setup"]]
        assert row["scaling_efficiency"] == pytest.approx(row["tokens_per_s"] / 2 / base["tokens_per_s"])
    assert all(r["scaling_efficiency"] > 0.9 for r in rows if r["parallel"] == "ddp")
    # Without the baseline in the report, the efficiency recorded at run time is shown, named.
    ddp = [json.loads(line) for line in path.read_text().splitlines()
           if json.loads(line)["setup"].get("parallel") == "ddp"]
    only = tmp_path / "ddp.jsonl"
    only.write_text("".join(json.dumps(r) + "\n" for r in ddp))
    assert main(["report", str(only), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert ({r["setup"]: r["scaling_efficiency"] for r in rows}
            == {r["setup"]["name"]: r["scaling"]["efficiency"] for r in ddp})
    assert all(names(r["scaling_baseline"], "recorded", "run time") for r in rows)


H200X2 = Path(__file__).parent.parent / "benchmarks/results/h200x2-2026-12-01-one-gpu-ddp-fsdp2.jsonl"


def test_the_note_on_cpu_jobs_speaks_of_the_cpu_not_of_gpus(capsys):
    # gloo jobs on one machine's CPU: "one GPU each ... (per GPU) ... pays for every GPU of the
    # job" described no GPU; their cost pays for the machine once (Row.gpus is 1).
    cpu = Path(__file__).parent / "data" / "cpu-fsdp2-x2.jsonl"
    for path, said, unsaid in ((cpu, ("sharing the CPU", "pays for the machine"), "GPU"),
                               (H200X2, ("one GPU each", "every GPU of the job"), "the CPU")):
        assert main(["report", str(path)]) == 0
        (note,) = lines_naming(capsys.readouterr().out, "torchrun job")
        assert names(note, *said) and unsaid not in note


def _planned(*flags):
    """The setups `stepbench run --device cuda --attn sdpa --init cpu FLAGS` plans."""
    from stepbench.settings import RunSettings

    given = dict(zip(flags[::2], flags[1::2]))
    given = {k.lstrip("-").replace("-", "_"): v for k, v in given.items()}
    return RunSettings.build({"device": "cuda", "attn": "sdpa", "init": "cpu", **given}) \
        .resolved("cuda").plan()


def test_fsdp2_records_written_before_the_wrapping_axes_keep_their_keys_and_meet_no_new_wrapping():
    from stepbench.setup import Setup

    written = [json.loads(line)["setup"] for line in H200X2.read_text().splitlines()]
    written = [w for w in written if w.get("parallel") == "fsdp2"]
    old = [Setup.from_dict(w) for w in written]
    assert {s.mode for s in old} == {"eager", "compile"}
    for setup, fields in zip(old, written):
        # The key is the setup as written, less its name: no new field shows in it.
        assert setup.key() == json.dumps({k: v for k, v in fields.items() if k != "name"},
                                         sort_keys=True)
        assert setup.to_dict() == fields
        assert setup.fsdp_reshard is True and setup.fsdp_prefetch is False
        assert setup.fsdp_optimizer == "dtensor"
    keys = {s.key() for s in old}
    today = _planned("--parallel", "fsdp2", "--nproc", "2")
    # Today's wrapping, eager, is what they ran: resumed, not measured again. A compiled fsdp2
    # setup now says it compiles per layer, so the old record (scope left out) is not taken for it.
    eager, compiled = today
    assert eager.key() in keys
    assert compiled.compile_scope == "layer" and compiled.name == "compile/layer+sdpa"
    assert compiled.key() not in keys
    # AdamW over the local shards is a setup of its own.
    (local,) = _planned("--parallel", "fsdp2", "--nproc", "2", "--modes", "eager",
                        "--fsdp-optimizer", "local")
    assert local.key() not in keys and local.name == "eager+sdpa+local-optim"
    # Each new wrapping choice is a setup of its own.
    variants = _planned("--parallel", "fsdp2", "--nproc", "2", "--fsdp-reshard", "off,on",
                        "--fsdp-prefetch", "off,on", "--optimizer", "fused,foreach")
    assert len({s.key() for s in variants}) == len(variants) == 16
    assert not {s.key() for s in variants if (s.fsdp_reshard, s.fsdp_prefetch, s.optimizer)
                != (True, False, "fused")} & keys
    mixed = _planned("--parallel", "fsdp2", "--nproc", "2", "--precision", "mixed-bf16")
    assert not {s.key() for s in mixed} & keys
    assert {"eager+sdpa", "compile/layer+sdpa+foreach", "eager+sdpa+no-reshard+prefetch",
            "compile/layer+sdpa+foreach+no-reshard+prefetch"} <= {s.name for s in variants}


def test_a_job_is_held_to_one_gpu_compiled_whole_in_bf16():
    (job,) = _planned("--parallel", "fsdp2", "--nproc", "2", "--modes", "compile",
                      "--precision", "mixed-bf16", "--fsdp-reshard", "off")
    twin = job.single_process_twin()
    assert (twin.parallel, twin.nproc, twin.compile_scope, twin.dtype) == ("none", 1, "model", "bf16")
    assert twin.key() == _planned("--modes", "compile")[0].key()
    # The golden of a job's wrapping, word for word.
    assert job.wrapping == ("per layer + root, no reshard, implicit prefetch, fp32 params, "
                            "bf16 compute, fp32 reduce, optimizer on DTensors, layers compiled")
    (ddp,) = _planned("--parallel", "ddp", "--nproc", "2", "--modes", "compile",
                      "--compile-scope", "layer")
    assert ddp.name == "compile/layer+sdpa" and names(ddp.wrapping, "DDP", "layers compiled")
    assert ddp.single_process_twin().compile_scope == "model"


def test_a_users_blocks_or_none_name_fsdp2s_units_in_the_same_words():
    from stepbench.measure import parallel

    (job,) = _planned("--parallel", "fsdp2", "--nproc", "2", "--modes", "compile",
                      "--fsdp-unit", "2", "--fsdp-prefetch", "on")
    assert parallel.wrapping(job) == job.wrapping == job.wrapped_as()
    assert job.wrapped_as("Block") == ("per 2 Blocks + root, reshard, explicit prefetch, "
                                       "bf16 params, optimizer on DTensors, blocks compiled")
    # One unit, the root: nothing to reshard or prefetch; compiled whole before sharding.
    assert parallel.wrapping(job, ([], None)) == job.wrapped_as("") == (
        "root alone (no block class named), bf16 params, optimizer on DTensors, compiled whole")
    assert parallel.wrapping(job, (["a block"], "Block")) == job.wrapped_as("Block")
    (ddp,) = _planned("--parallel", "ddp", "--nproc", "2", "--modes", "eager")
    assert ddp.wrapped_as("") == ddp.wrapped_as("Block") == "DDP"


def test_the_scaling_table_names_each_jobs_wrapping(capsys):
    assert main(["report", str(H200X2), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    scaling = text[text.index("Details: scaling"):]
    header = next(line for line in scaling.splitlines() if line.startswith("| GPU"))
    assert "| Processes | Wrapping |" in header
    rows = table_rows(scaling.split("\n\n## ")[0])
    at = rows[0].index("Processes")
    wrapping = {(row[at], row[at + 1]) for row in rows[1:]}
    assert {("ddp x2", "DDP"), ("ddp x2", "DDP, compiled whole")} <= wrapping
    fsdp2 = sorted(w for processes, w in wrapping if processes == "fsdp2 x2")
    # per layer, resharded, implicit prefetch, bf16 params: compiled whole, and by layer
    assert len(fsdp2) == 2 and all(names(w, "per layer + root", "reshard", "implicit prefetch",
                                         "bf16 params", "optimizer on DTensors")
                                   and "no reshard" not in w for w in fsdp2)
    assert ["layers compiled" in w for w in fsdp2] == [False, True]


GPT = Path(__file__).resolve().parent.parent / "examples/gpt.py"


@pytest.mark.slow
def test_a_user_factory_runs_as_ddp_and_fsdp2_jobs_and_trains_the_single_process_model(tmp_path,
                                                                                      capsys):
    # gpt.py draws its batch from a generator of its own: every rank trains the same batch, so
    # the averaged gradients are the single process's and so are the losses, step by step.
    tiny = ["--param", "n_layer=2", "--param", "n_embd=32", "--param", "n_head=2",
            "--param", "vocab_size=128"]
    proc = run_cli("run", "--model", f"{GPT}:make", "--device", "cpu", "--seq", "16", "--batch",
                   "2", "--precision", "fp32", "--modes", "eager", "--warmup", "1", "--steps", "2",
                   "--repeats", "1", *tiny, "--nproc", "2", "--parallel", "none,ddp,fsdp2",
                   "--out", tmp_path / "r.jsonl", "--format", "json", check_json=True)
    single, ddp, fsdp2 = proc.records
    assert [r["status"] for r in proc.records] == ["ok"] * 3, proc.stderr
    for job in (ddp, fsdp2):
        assert job["units"] == "tokens" and job["setup"]["params"] == single["setup"]["params"]
        assert job["tokens_per_s"] == pytest.approx(2 * 16 * 2 / (job["step_ms"] / 1000))
        for rank in job["ranks"]:
            assert rank["loss_first"] == pytest.approx(single["loss_first"], rel=1e-5)
            assert rank["loss_last"] == pytest.approx(single["loss_last"], rel=1e-4)
    # The single-process setup ran first and cached its FLOP count, which each job's ranks read
    # (a rank never counts): TFLOP/s per process, at the slowest rank's step time.
    counted = single["flops_per_step"]
    assert counted > 0 and single["flops_source"] == "flop_counter"
    for job in (ddp, fsdp2):
        assert (job["flops_per_step"], job["flops_source"]) == (counted, "flop_counter")
        assert job["achieved_tflops"] == pytest.approx(counted / (job["step_ms"] / 1000) / 1e12)
        assert job["mfu_datasheet"] is None                 # no datasheet peak for a CPU
        assert lines_naming("\n".join(job["notes"]), "single-process", "cached")
    assert ddp["scaling"]["wrapping"] == "DDP"
    # The Workload names its block (gpt.Block): one FSDP2 unit per block, then the root.
    assert names(fsdp2["scaling"]["wrapping"].split(", ")[0], "per Block + root")
    assert "reshard" in fsdp2["scaling"]["wrapping"].split(", ")[1]
    # A factory that names no block, compiled: FSDP2 shards the root alone, compiled whole.
    (tmp_path / "mlp.py").write_text(MLP)
    # In its cache, what a compile killed mid-way leaves (measure/inductor_cache.py): an empty
    # shared object under inductor's lock name; the ranks remove it before they compile.
    stub = tmp_path / "inductor" / "zz" / "czzkilled.main.so"
    stub.parent.mkdir(parents=True)
    stub.touch()
    (tmp_path / "inductor" / "locks").mkdir()
    (tmp_path / "inductor" / "locks" / "czzkilled.lock").touch()
    proc = run_cli("run", "--model", f"{tmp_path / 'mlp.py'}:make", "--device", "cpu",
                   "--batch", "4", "--precision", "fp32", "--modes", "compile", "--warmup", "1",
                   "--steps", "2", "--repeats", "1", "--nproc", "2", "--parallel", "fsdp2",
                   "--compile-cache", tmp_path / "inductor", "--out", tmp_path / "root.jsonl",
                   "--format", "json", check_json=True)
    (root,) = proc.records
    assert root["status"] == "ok", proc.stderr
    assert root["scaling"]["wrapping"].startswith("root alone (no block class named)")
    first, second = root["ranks"]
    assert first["loss_first"] == pytest.approx(second["loss_first"], rel=1e-5)
    assert root["setup"]["mode"] == "compile" and root["compile"]["graphs"] >= 1
    assert not stub.exists()
    # No single-process run of it cached a FLOP count: no FLOPs; the note says how to get them.
    assert root.get("flops_per_step") is None
    assert lines_naming("\n".join(root["notes"]), "--parallel none", "flops_per_step")
    # Its report's scaling table counts its own unit; its notes say why it has no MFU.
    assert main(["report", str(tmp_path / "root.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "Samples/s per GPU" in text and "Tokens/s" not in text
    assert lines_naming(text, "--parallel none", "flops_per_step")


MLP = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.body(x), y)


def make(batch_size, device):
    x, y = torch.randn(batch_size, 8, device=device), torch.randn(batch_size, 1, device=device)
    return Net().to(device), lambda: (x, y)
"""


def test_fsdp2_shards_a_model_without_a_named_block_as_one_unit(tmp_path):
    # In this process, as the one rank of a job of one: the root alone is sharded, and the step
    # trains the model it trains without a wrapper.
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from stepbench.measure import parallel, step
    from stepbench.setup import Setup

    (tmp_path / "mlp.py").write_text(MLP)
    common = dict(model=f"{tmp_path / 'mlp.py'}:make", mode="eager", attn="sdpa", batch=4, seq=1,
                  device="cpu", dtype="fp32")
    losses = {}
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        for style in ("none", "fsdp2"):
            setup = Setup(**common, parallel=style, nproc=1)
            work, run, _ = step.build_workload(setup, torch.device("cpu"))
            losses[style] = [run().item() for _ in range(3)]
        assert isinstance(work.model, FSDPModule)
        assert not any(isinstance(m, FSDPModule) for m in list(work.model.modules())[1:])
        assert parallel.wrapping(setup, work.shard_units()).startswith("root alone")
    finally:
        dist.destroy_process_group()
    assert losses["fsdp2"] == pytest.approx(losses["none"], rel=1e-5)


def test_a_distributed_factory_setup_reads_the_single_process_flop_count_or_names_the_fix(
        tmp_path, monkeypatch):
    # In this process, as the one rank of a job of one. A rank never counts (DDP's reducer, FSDP2's
    # collectives): it reads what the single-process setup of the same model and per-rank batch
    # cached, under FSDP2's classes and layers compiled in place as under DDP.
    import torch
    import torch.distributed as dist

    from stepbench.measure import cache, step
    from stepbench.setup import Setup

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    common = dict(model=f"{GPT}:make", attn="sdpa", batch=2, seq=16, device="cpu",
                  dtype="fp32", compile_scope="layer", nproc=1,
                  params="n_embd=32;n_head=2;n_layer=2;vocab_size=128")

    def fields(parallel, mode="eager"):
        setup = Setup(**common, mode=mode, parallel=parallel)
        work, _, _ = step.build_workload(setup, torch.device("cpu"))
        return work.flop_fields(setup, 100.0, None, count=True)

    jobs = (("ddp", "eager"), ("fsdp2", "eager"), ("fsdp2", "compile"))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        for job in jobs:
            uncounted = fields(*job)
            assert uncounted.get("flops_per_step") is None and "mfu_datasheet" not in uncounted
            (note,) = uncounted["notes"]
            assert names(note, "--parallel none", "flops_per_step"), note
        assert not (tmp_path / "cache" / "factory_flops.json").exists()     # nothing counted
        single = fields("none")
        counted = single["flops_per_step"]
        assert counted > 0 and single["flops_source"] == "flop_counter" and not single["notes"]
        for job in jobs:
            read = fields(*job)
            assert (read["flops_per_step"], read["flops_source"]) == (counted, "flop_counter")
            # 100 tokens/s of 2 x 16 per step; no datasheet peak for a CPU.
            assert read["achieved_tflops"] == pytest.approx(counted * 100 / 32 / 1e12)
            assert read["mfu_datasheet"] is None
            (note,) = read["notes"]
            assert names(note, "single-process", "cached"), note
    finally:
        dist.destroy_process_group()


def test_the_report_shows_a_jobs_flops_from_its_single_process_count_and_why_one_has_none(
        capsys):
    # A real CPU run of examples/gpt.py (tiny) at `--nproc 2 --parallel ddp,none,fsdp2`, made
    # before a run measured `none` first: the ddp job ran before the single-process setup had
    # cached its count, the fsdp2 job after it.
    path = Path(__file__).resolve().parent / "data" / "cpu-gpt-ddp-none-fsdp2-flops.jsonl"
    assert main(["report", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {row["parallel"]: row for row in doc["rows"]}
    records = {r["setup"].get("parallel", "none"): r for r in read_jsonl(path)}
    assert rows["ddp"]["achieved_tflops"] is None
    for style in ("none", "fsdp2"):
        assert rows[style]["achieved_tflops"] == pytest.approx(records[style]["achieved_tflops"])
    assert records["fsdp2"]["flops_per_step"] == records["none"]["flops_per_step"]
    assert len(lines_naming("\n".join(doc["notes"]), "ddp x2", "--parallel none",
                            "flops_per_step")) == 1
    assert lines_naming("\n".join(doc["notes"]), "FlopCounterMode", "fsdp2", "single-process")
