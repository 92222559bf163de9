"""docs/cli.md's flag table of `stepbench run`, made from the command's parser, whose flags come
from the axis registry (axes.py) and the settings declarations (stepbench.settings): a row per
flag, its default and meaning from the declaration (`doc`, else its help).

    python -m stepbench.cli.doc            print the table
    python -m stepbench.cli.doc --write    put it into docs/cli.md, between its markers
    python -m stepbench.cli.doc --check    exit 1 when docs/cli.md's table is not this one

tests/test_settings_declared.py fails when docs/cli.md and the declarations disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepbench.axes import AXES, Axis
from stepbench.settings import RunSettings, Setting, declared

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"
BEGIN = ("<!-- The flags of stepbench run, generated from the axis and settings declarations: "
         "edit those, then run `python -m stepbench.cli.doc --write` -->")
END = "<!-- end of the generated flags -->"

# The docs' longer text for the axes (default, meaning; None: made from the registry), until
# axes.Axis carries a `doc` of its own; an axis not named here gets its help.
AXIS_DOCS: dict[str, tuple[str | None, str]] = {
    "model": (None, "preset (`llama-468m` = the post's config, `llama-135m` = SmolLM2-135M's "
                    "shape, `llama-small`, `llama-tiny`) or the path of an HF `config.json` (or a "
                    "folder holding one) of any causal LM transformers knows; random weights, "
                    "nothing downloaded; or your own model's factory, `FILE.py:FUNCTION` or "
                    "`package.module:FUNCTION` ([workloads.md](workloads.md))"),
    "modes": (None, "comma list of `eager`, `compile`"),
    "attn": (None, "comma list of `attn_implementation`s: `eager`, `sdpa`, `flex_attention`, "
                   "`flash_attention_2`, `flash_attention_3` (the last two need flash-attn on a "
                   "GPU, else `unsupported`)"),
    "compile_mode": (None, "comma list: `default`, `reduce-overhead` (CUDA graphs; refused on the CPU), "
                           "`max-autotune`, `max-autotune-no-cudagraphs`"),
    "compile_scope": (None, "comma list: `model` (torch.compile the whole model), `layer` "
                            "(compile each decoder layer on its own); needs `compile` in "
                            "`--modes`. A compiled `--parallel fsdp2` setup always compiles per "
                            "layer (`compile/layer+...`)"),
    "precision": (None, "comma list: `bf16`, `fp16`, `fp32` (pure: weights, gradients and "
                        "optimizer state, as in the post), `autocast-bf16` (fp32 master weights, "
                        "forward under bf16 autocast), `mixed-bf16` (`--parallel fsdp2` only: "
                        "fp32 master weights, FSDP2's mixed precision, bf16 compute, fp32 "
                        "gradient reduction), `float8` (torchao float8 linear layers on bf16 "
                        "weights; GPU of compute capability 8.9+); `--dtype` is an alias"),
    "kernels": (None, "comma list: `none`, `liger` (liger-kernel's RMSNorm, RoPE, SwiGLU and "
                      "fused linear cross-entropy), `liger-no-flce` (the same without the fused "
                      "cross-entropy); GPU only"),
    "checkpointing": (None, "`off`, `on` or `off,on`: activation checkpointing"),
    "optimizer": (None, "comma list: `fused`, `foreach` (AdamW's implementation)"),
    "batch": (None, "comma list of batch sizes; every combination with `--seq` runs"),
    "seq": (None, "comma list of sequence lengths"),
    "warmup": (None, "untimed steps after the first one"),
    "seed": (None, "same seed = same weights and tokens in every setup, so losses are "
                   "comparable"),
    "init": (None, "where the random weights are drawn: `device` (on the GPU, in fp32, then "
                   "cast: milliseconds) or `cpu` (as stepbench 0.1 and the post's script did: "
                   "seconds of single-threaded random numbers for the post's model). The two "
                   "give different weights for one seed, so `init` is part of the setup: records "
                   "of 0.1 read as `cpu`, and `--init cpu` resumes or reproduces them"),
    "memory_limit_gb": ("none", "cap each child's memory to see what fits a smaller card (GPU: a "
                                "fraction of the card; CPU: the memory that the setup's build, "
                                "first step and warm-up steps may allocate beyond what its "
                                "process holds after the imports, heap and private mappings "
                                "alike: not the tensors alone, so a step needs more than the "
                                "peak memory its record reports, which counts only the tensors "
                                "(1.2 times for llama-tiny at batch 8 x 256); the same for a "
                                "forked and a fresh process, whatever it ran before, and on a "
                                "busy machine. The capped steps run slower (1.7x for llama-tiny: "
                                "every block from 128 KiB up is mapped afresh), so the cap is "
                                "lifted before the timed steps, which repeat the warm-up's "
                                "computation at an uncapped step's speed; with `--warmup 0` the "
                                "timed steps run capped too (the record's "
                                "`memory_cap.timed_steps_capped`))"),
    "parallel": (None, "comma list of `none`, `ddp`, `fsdp2`: each setup as one torchrun job of "
                       "`--nproc` processes with DistributedDataParallel or FSDP2 (`none`: one "
                       "process, measured first: the baseline of scaling efficiency, and a "
                       "user's model's FLOP count for its `ddp` and `fsdp2` jobs)"),
    "nproc": (None, "processes (GPUs) per job and node; `--batch` is per process, so the global "
                    "batch is batch x nproc x nnodes. Each job takes `--nproc` GPUs of the "
                    "`--gpus` pool (default: the first `--nproc`)"),
    "nnodes": (None, "hosts one job spans (torchrun's `--nnodes`; with `--node-rank` and "
                     "`--rdzv-endpoint`: see [gpus.md](gpus.md#one-job-over-two-hosts))"),
    "fsdp_reshard": (None, "with `--parallel fsdp2`: comma list of `off`, `on`: whether each "
                           "decoder layer frees its gathered weights after its forward "
                           "([gpus.md](gpus.md#training-on-several-gpus---nproc-n---parallel-"
                           "ddpfsdp2))"),
    "fsdp_unit": (None, "with `--parallel fsdp2`: comma list of decoder layers per FSDP2 unit "
                        "([gpus.md](gpus.md#training-on-several-gpus---nproc-n---parallel-"
                        "ddpfsdp2))"),
    "fsdp_prefetch": (None, "with `--parallel fsdp2`: comma list of `off`, `on`: explicit "
                            "prefetching one unit ahead"),
    "fsdp_optimizer": (None, "with `--parallel fsdp2`: comma list of `dtensor` (AdamW over the "
                             "DTensor parameters), `local` (over each rank's local shards)"),
}
# Flags that are no setting (they say where the settings are).
CLI_DOCS = {"plan": "a TOML plan of the matrix ([Plan files](#plan-files)); flags given beside "
                    "it override it"}


def run_parser(settings: type = RunSettings) -> argparse.ArgumentParser:
    """`stepbench run`'s parser, its settings' flags from `settings`."""
    from stepbench.cli import run
    from stepbench.cli.base import Parser

    sub = Parser(prog="stepbench").add_subparsers()
    run.add(sub, settings)
    return sub.choices["run"]


def rows(parser: argparse.ArgumentParser, settings: type) -> list[tuple[str, str, str]]:
    """(flag, default, meaning) per flag of `parser`, in its order."""
    by_dest: dict[str, Setting | Axis] = {a.key: a for a in AXES}
    by_dest.update({s.dest: s for s in declared(settings)})     # --device: the setting's
    found = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        first, *aliases = (f"`{f}`" for f in action.option_strings)
        if action.metavar and action.nargs != 0:
            metavar = f"[{action.metavar}]" if action.nargs == "?" else action.metavar
            first = first[:-1] + f" {metavar}`"
        flag = ", ".join([first, *aliases])
        decl = by_dest.get(action.dest)
        if isinstance(decl, Setting):
            found.append((flag, _default(decl), decl.doc or decl.help))
        elif isinstance(decl, Axis):
            default, meaning = AXIS_DOCS.get(decl.key, (None, decl.help))
            found.append((flag, _axis_default(decl) if default is None else default, meaning))
        else:
            found.append((flag, "", CLI_DOCS.get(action.dest, action.help or "")))
    return found


def _default(s: Setting) -> str:
    if s.doc_default is not None:
        return s.doc_default
    value = s.default
    if value in (None, False, ()):
        return ""
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _axis_default(a: Axis) -> str:
    def text(value) -> str:
        values = value if isinstance(value, tuple) else (value,)
        return "`" + ",".join(("on" if v else "off") if a.kind is bool else str(v)
                              for v in values) + "`"
    if a.default is None:
        return "none"
    if isinstance(a.default, dict):
        return f"{text(a.default_for('cuda'))} on a GPU, {text(a.default_for('cpu'))} on the CPU"
    return text(a.default_for("cuda"))


def table(parser: argparse.ArgumentParser | None = None, settings: type = RunSettings) -> str:
    """The Markdown table of `parser`'s flags (default: `stepbench run`'s)."""
    parser = parser or run_parser(settings)
    lines = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for cells in rows(parser, settings):
        if any("\n" in c for c in cells):
            raise ValueError(f"a table cell of {cells[0]} holds a line break")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def written(text: str) -> str:
    """The table between the markers of `text` (docs/cli.md's)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} has no generated table: put {BEGIN!r} and {END!r} around it")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def replaced(text: str, new: str) -> str:
    """`text` with the table between its markers replaced by `new`."""
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{new}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC}")
    args.add_argument("--check", action="store_true", help=f"exit 1 if {DOC}'s table differs")
    opts = args.parse_args(argv)
    new = table()
    if opts.write:
        DOC.write_text(replaced(DOC.read_text(), new))
    elif opts.check:
        if written(DOC.read_text()) != new:
            print(f"{DOC}: the flag table is not the declarations'; run python -m "
                  "stepbench.cli.doc --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
