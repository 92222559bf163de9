"""torchtitan's FSDP2 recipe on stepbench's step: the reference that issue 26 compares
stepbench's own FSDP2 wrapping with.

Every rank builds the model, its tokens and its training step exactly as `stepbench run
--parallel fsdp2` does (measure/step.py: same Hugging Face LlamaForCausalLM, seed, AdamW, timing
loop), but the model is wrapped by torchtitan's code instead of measure/parallel.py:

- compiled, torchtitan's `apply_compile` (torchtitan/distributed/compile.py, 0.3.0, lines
  39-72): each decoder layer `.compile(backend="inductor", fullgraph=True)` in place, before
  sharding, with `torch._dynamo.config.capture_scalar_outputs = True`;
- then torchtitan's `apply_fsdp_to_decoder` (torchtitan/distributed/fsdp.py, 0.3.0, lines
  110-328), which its Hugging Face backend's `apply_fsdp`
  (experiments/transformers_modeling_backend/parallelize.py) repeats for dense models:
  `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=False)`; the
  embeddings one unit (reshard after forward); [final norm, output layer] one unit that keeps its
  weights (`reshard_after_forward=False`; tied embeddings: embeddings, norm and output in that
  one unit); each decoder layer one unit (resharded after forward); the root last, with FSDP2's
  defaults; gradient division off (`set_gradient_divide_factor(1.0)`: torchtitan scales the
  loss itself; here the gradients are the ranks' sum, which AdamW's update hardly sees); no
  explicit prefetching for dense models.

torchtitan is imported when it is importable (carry its wheel and its small dependencies:
spmd_types, tyro, docstring-parser, typeguard, shtab); its model-facing attributes
(`tok_embeddings`, `layers`, `norm`, `lm_head`, `enable_weight_tying`) are lent to the HF model
for the call, as its HF backend's model wrapper exposes them. Where it cannot be imported (torch
older than it needs, a missing dependency), the same calls are made here, following the lines
named above; the record's `recipe.source` says which ran, and why.

--precision: mixed-bf16 (torchtitan's default: fp32 weights, `training.dtype` float32) or bf16
(`training.dtype` bfloat16: bf16 weights; the reduction stays fp32, the only value torchtitan's
config takes). On gloo (the CPU) FSDP2 reduces with a plain sum (gloo has no PREMUL_SUM).

Run under torchrun, one process per GPU, e.g. on two GPUs:

    PYTHONPATH=src python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/torchtitan_fsdp2.py --modes compile --out tt.jsonl --baseline one-gpu.jsonl

Rank 0 appends one JSON line to --out: the setup (as stepbench would name it), `recipe`, the job's
step times, tokens/s and every rank's numbers (measure/distributed.combine), and `scaling` with
the efficiency against --baseline's record of the same setup on one GPU without a wrapper
(`Setup.single_process_twin()`: compiled whole, bf16), as stepbench's runner computes it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from stepbench.measure import distributed, machine, options, parallel, step  # noqa: E402
from stepbench.settings import RunSettings  # noqa: E402

SOURCE = {"source": None, "why": None}


def args_of(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="preset or config (default: run's, per device)")
    p.add_argument("--modes", default="compile", choices=("eager", "compile"))
    p.add_argument("--precision", default="mixed-bf16", choices=("mixed-bf16", "bf16"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--recipe", default="auto", choices=("auto", "package", "copy"),
                   help="torchtitan's own functions, the calls made here, or the first that works")
    p.add_argument("--out", type=Path, required=True, help="JSON Lines file rank 0 appends to")
    p.add_argument("--baseline", type=Path, help="stepbench results holding the one-GPU baseline")
    p.add_argument("--profile", type=Path, help="folder for one more step's profile per rank")
    return p.parse_args(argv)


def planned_setup(args, world: int):
    """The setup `stepbench run` plans for the same flags (so its one-GPU twin is the record
    a plain run makes)."""
    given = {"modes": args.modes, "attn": "sdpa", "precision": args.precision,
             "batch": str(args.batch), "parallel": "fsdp2", "nproc": str(world),
             "warmup": args.warmup, "steps": args.steps, "device": args.device,
             "model": args.model, "seq": None if args.seq is None else str(args.seq)}
    (setup,) = RunSettings.build(given).resolved(args.device).plan()
    return setup


# ---------------------------------------------------------------- torchtitan's recipe

def titan_view(model) -> dict:
    """The attributes torchtitan's functions read, as its HF backend's model wrapper gives them
    (experiments/transformers_modeling_backend/model.py: tok_embeddings, layers, norm, lm_head)."""
    base = model.model
    return {"tok_embeddings": base.embed_tokens, "norm": base.norm,
            "layers": torch.nn.ModuleDict({str(i): layer for i, layer in enumerate(base.layers)}),
            "enable_weight_tying": base.embed_tokens.weight is model.lm_head.weight}


def package_recipe(model, mesh, param_dtype, reduce_dtype, compiled: bool) -> None:
    """torchtitan's own apply_compile and apply_fsdp_to_decoder."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    if compiled:
        apply_compile(model, compile_config=CompileConfig(enable=True, backend="inductor"),
                      parallel_dims=types.SimpleNamespace(tp_enabled=False))
    apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                          pp_enabled=False)


def copied_recipe(model, mesh, param_dtype, reduce_dtype, compiled: bool) -> None:
    """The same calls as torchtitan 0.3.0's apply_compile (compile.py 39-72) and
    apply_fsdp_to_decoder (fsdp.py 110-328) make for a dense decoder without pipelining."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if compiled:
        torch._dynamo.config.capture_scalar_outputs = True                     # compile.py 56
        for block in model.layers.values():
            block.compile(backend="inductor", fullgraph=True)                  # compile.py 70
    config = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(                 # fsdp.py 165-170
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False)}
    if model.enable_weight_tying:                                              # fsdp.py 180-192
        fully_shard([model.tok_embeddings, model.norm, model.lm_head], **config,
                    reshard_after_forward=False)
    else:                                                                      # fsdp.py 193-207
        fully_shard(model.tok_embeddings, **config, reshard_after_forward=True)
        fully_shard([model.norm, model.lm_head], **config, reshard_after_forward=False)
    for block in model.layers.values():                                        # fsdp.py 209, 303
        fully_shard(block, **config, reshard_after_forward=True)
    fully_shard(model, **config)                                               # fsdp.py 310
    for module in model.modules():                                             # fsdp.py 316
        if isinstance(module, FSDPModule):
            # set_reduce_scatter_divide_factor: its name in torch releases before the rename.
            divide = getattr(module, "set_gradient_divide_factor", None) \
                or module.set_reduce_scatter_divide_factor
            divide(1.0)


def titan_wrap(setup, model, choice: str):
    """measure/parallel.wrap's stand-in: torchtitan's recipe on `model`, sharded in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    mesh = init_device_mesh(setup.device, (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    view = titan_view(model)
    for name, value in view.items():            # lent, not registered: no second module path
        object.__setattr__(model, name, value)
    compiled = setup.mode == "compile"
    if compiled:
        # The step hands every layer Hugging Face's KV cache, guarded per layer: one graph per
        # layer, past dynamo's recompile limit, as stepbench's own per-layer compile allows
        # (measure/options.py); at the limit, torchtitan's fullgraph=True would raise.
        options.allow_a_graph_per_layer(len(view["layers"]))
    try:
        recipe = package_recipe if choice == "package" else copied_recipe
        if choice == "auto":
            try:
                import torchtitan.distributed.compile  # noqa: F401
                import torchtitan.distributed.fsdp  # noqa: F401
                recipe = package_recipe
            except Exception as exc:  # noqa: BLE001 - any reason it cannot load is reported
                SOURCE["why"] = f"{type(exc).__name__}: {exc}"[:300]
        recipe(model, mesh, torch.bfloat16, torch.float32, compiled)
        SOURCE["source"] = ("torchtitan " + _version("torchtitan") if recipe is package_recipe
                            else "copied calls (torchtitan 0.3.0 compile.py, fsdp.py)")
    finally:
        for name in view:
            object.__delattr__(model, name)
    if setup.device == "cpu":
        for module in model.modules():          # gloo has no PREMUL_SUM: the same sum, plainly
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def _version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


# ---------------------------------------------------------------- one rank

def baseline_of(path: Path | None, setup, gpu: str):
    """The latest ok record of the one-GPU twin on this GPU, as the runner finds it."""
    if path is None or not path.exists():
        return None
    from stepbench.record import ResultsFile

    key = setup.single_process_twin().key()
    found = [r for r in ResultsFile(path).latest()
             if r.ok and r.setup.key() == key and r.machine.gpu == gpu]
    return found[-1] if found else None


def main(argv) -> int:
    args = args_of(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    setup = planned_setup(args, world)
    # weight_dtype: fp32 for mixed-bf16 (torchtitan's training.dtype float32), bf16 for bf16.
    assert options.weight_dtype(setup) == (torch.float32 if args.precision == "mixed-bf16"
                                           else torch.bfloat16)
    parallel.wrap = lambda s, model: titan_wrap(s, model, args.recipe)

    def progress(phase, *rest, **info):
        if phase == "timed":
            dist.barrier()          # every rank starts its timed window together

    measured: dict = {}
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stem = args.profile and str(args.profile / f"torchtitan_{setup.name.replace('/', '-')}_"
                                                f"{setup.dtype}_x{world}_rank{rank}")
    step.measure(setup, measured, progress, profile=stem)
    mine = distributed.rank_summary(measured, rank_=rank, local_rank=local_rank, node=0)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        job = distributed.combine(setup, everyone, measured)
        info = machine.machine_info(setup.device, local_rank)
        base = baseline_of(args.baseline, setup, info.get("gpu", "cpu"))
        if base is not None:
            from stepbench.execute.runner import scaling_against

            job["scaling"].update(scaling_against(job["scaling"], base))
        line = {"recipe": {**SOURCE, "torchtitan": _version("torchtitan")},
                "setup": setup.to_dict(), "status": "ok", "started_at": started,
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "params": measured.get("params"), "loss_first": measured.get("loss_first"),
                "losses": measured.get("losses"), "phases": measured.get("phases"),
                "compile": measured.get("compile"), "profile": measured.get("profile"),
                **job, "machine": info, "software": machine.software_info()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        eff = job["scaling"].get("efficiency")
        print(f"torchtitan recipe ({SOURCE['source']}): {setup.name} {setup.dtype} x{world}: "
              f"{job['step_ms']:.1f} ms/step, {job['tokens_per_s']:,.0f} tokens/s, efficiency "
              + (f"{eff:.1%}" if eff is not None else "- (no baseline)")
              + (f"; torchtitan not imported: {SOURCE['why']}" if SOURCE["why"] else ""),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
