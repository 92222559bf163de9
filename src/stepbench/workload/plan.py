"""A factory's part of a plan, settled in the parent before any process starts: which axes apply
to the user's model, what is passed to the factory, and the user's own axes (`--param`).

- mode, compile mode and scope, precision, optimizer, batch, checkpointing apply to any module;
- `seq` is passed as `seq_len` where the factory declares it; otherwise it does not apply and
  the setups hold seq 1 (a batch's units are its samples unless the workload says otherwise);
- attention kernels and fused kernels are a transformers model's: a factory that declares a
  keyword of that name (`attn`, `kernels`) gets the values through its parameters, any other
  refuses them in one line;
- torchrun jobs (`--parallel ddp,fsdp2`) wrap any module (measure/parallel.py);
- per-layer compile and activation checkpointing act on each of the model's repeated blocks
  (`per_block`): a model without one cannot take them, which its records say (`blocks`).
"""

from __future__ import annotations

from typing import Mapping

from stepbench.errors import UserError
from stepbench.workload.spec import (DECLARABLE_AXES, PASSED, check_params, combos,
                                     no_default, not_an_axis, parse_param_specs, signature)

# Axes given through the factory's own keywords where it declares one -> the keyword.
FLAGS = {"attn": "--attn", "kernels": "--kernels", "seq": "--seq"}

BLOCK_FIX = "return stepbench.Workload(block=YourBlockClass)"


def factory_values(values: Mapping[str, object]) -> dict:
    """`values` (axis name -> tuple or value) for a factory's setups."""
    from stepbench.axes import axis

    values = dict(values)
    model = values["model"]
    sig = signature(model)
    params = parse_param_specs(values.get("params"))
    params = check_params(sig, params)
    for name, keyword in DECLARABLE_AXES.items():
        given = _tuple(values.get(name))
        default = _tuple(axis(name).default_for(values.get("device") or "cuda"))
        if sig.declares(keyword) or (not sig.checked and given not in (default, default[:1])):
            # (A factory accepted unread gets what was asked; its process says if it takes it.)
            params[keyword] = tuple(str(v) for v in given)
        elif given not in (default, default[:1]):
            raise UserError(not_an_axis(model, FLAGS[name], keyword))
        values[name] = default[:1]
    for name in sig.required:
        if name not in PASSED and name not in params:
            raise UserError(no_default(model, name))
    seq = _tuple(values.get("seq"))
    if not sig.takes("seq_len"):
        default = _tuple(axis("seq").default_for(values.get("device") or "cuda"))
        if seq not in (default, (1,)):
            raise UserError(f"--seq does not apply to {model}: it takes no `seq_len` keyword; "
                            "drop --seq (or let the factory take `seq_len`)")
        values["seq"] = (1,)
    values["params"] = combos(params)
    return values


def no_params(values: Mapping[str, object]) -> None:
    if values.get("params"):
        raise UserError(f"--param sets a parameter of your own model's factory; --model "
                        f"{values.get('model')} is not one (pass --model FILE.py:FUNCTION)")


def _tuple(value) -> tuple:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def tune_params(fields: Mapping[str, object]) -> tuple:
    """Every combination of a tune's `--param` values (each `NAME=V1,V2`), checked as a run's
    matrix is (factory_values): the candidates the tune searches, canonical, the first its
    start. `fields`: one value per axis, the flags' `--param` values as given."""
    return factory_values(_as_matrix(fields))["params"]


def _as_matrix(fields: Mapping[str, object]) -> dict:
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in fields.items()}
    params = values.get("params")
    values["params"] = (params,) if isinstance(params, str) else params
    return values


def one_setup_values(fields: Mapping[str, object]) -> dict:
    """`fields` (one value per axis: a tune's start) for a factory's setup, checked as a
    run's matrix is (factory_values); one combination of `--param` only."""
    settled = factory_values(_as_matrix(fields))
    if len(settled["params"]) > 1:
        raise UserError("tune searches one model: give each --param one value")
    return {k: (v[0] if isinstance(v, tuple) and k in fields and not isinstance(fields[k], tuple)
                else v) for k, v in settled.items()}


def per_block(setup) -> list[str]:
    """The options of `setup` that act on each of the model's repeated blocks, by flag: per-layer
    compile (but under FSDP2, which shards a model without a named block as its root alone and
    compiles it whole: measure/parallel.py) and activation checkpointing."""
    found = []
    if setup.mode == "compile" and setup.compile_scope == "layer" and setup.parallel != "fsdp2":
        found.append("--compile-scope layer")
    if setup.checkpointing:
        found.append("--checkpointing on")
    return found


# Under FSDP2 the compile scope changes nothing (measure/parallel.py: each repeated block compiled
# on its own, a model without one whole): one setup, as setup.planned names it, whichever asked.
FSDP2_SCOPES = ("--compile-scope model and layer are one setup under FSDP2 (compile/layer): FSDP2 "
                "compiles each repeated block on its own either way, and a model without one whole")


def no_blocks(needed_by: str, model: str, block: str | None = None) -> str:
    """Why an option that acts on each repeated block cannot run on `model`, with the fix;
    `block`: the class its Workload named, of which the model holds none."""
    if block:
        return (f"{needed_by}: {model}'s model holds no {block}, the block its Workload names; "
                "name a class the model repeats")
    return f"{needed_by}: {model}'s model has no repeated block; {BLOCK_FIX}"
