"""The user's workload: `--model path/file.py:make` or `--model pkg.module:make`, built in the
setup's process after the seed is set.

The factory is called with `batch_size`, `device` (and `seq_len`, `attn`, `kernels` where it
declares them) and the setup's own parameters (`--param`), and returns `(model, make_batch)` or
a `stepbench.Workload`. The model is cast to the setup's weight dtype and moved to the device;
`make_batch()` is called once and the batch's floating-point tensors are cast to the weights'
dtype (a bf16 model takes bf16 images), as a plain training script would make them.
What goes wrong here is the user's to fix and says so in one line (`WorkloadError`); the worker
records it as a failed setup with the traceback.
"""

from __future__ import annotations

import functools
import sys

from stepbench.workload import flopcache, sigreader
from stepbench.workload.contract import Workload
from stepbench.workload.base import Built, tensors_in
from stepbench.workload.loader import load_function
from stepbench.workload.plan import no_blocks
from stepbench.workload.spec import (DECLARABLE_AXES, PASSED, Signature, no_batch_size,
                                     no_default, no_such_param, not_an_axis, params_of,
                                     typed)


class WorkloadError(RuntimeError):
    """The user's factory, batch or loss is not what stepbench can train; the text says why."""


class FactoryBuilt(Built):
    def __init__(self, setup, device):
        from stepbench.measure import options

        self.setup = setup
        self.factory = load_function(setup.model)
        made = self.factory(**self.kwargs(setup))
        work = as_workload(made, setup.model)
        check_workload(work, setup.model)
        self.work = work
        self.model = work.model
        self.units = work.units or "samples"
        self.units_per_batch = work.units_per_batch or setup.batch
        dtype = options.weight_dtype(setup)
        self.model.to(device=device, dtype=dtype)
        inputs = work.make_batch()
        check_devices(inputs, device, setup.model)
        check_call(self.model, inputs)
        # autocast-bf16 keeps fp32 weights and inputs: autocast casts inside the forward.
        self.inputs = cast_floats(inputs, None if setup.dtype == "autocast-bf16" else dtype)
        materialize_lazy(self.model, self.inputs)
        # Found once, before any option wraps the model (FSDP2 and compile replace classes):
        # what layers() gives and the record's `blocks` says.
        self._blocks = find_blocks(self.model, work.block)

    def kwargs(self, setup) -> dict:
        sig = Signature(setup.model, **sigreader.of_function(self.factory))
        kwargs = {"batch_size": setup.batch, "device": setup.device}
        if sig.declares("seq_len"):
            kwargs["seq_len"] = setup.seq
        defaults = dict(sig.defaults)
        given = params_of(setup.params)
        for name, text in given.items():
            kwargs[name] = typed(text, defaults.get(name))
        # What the setup's name and params leave unsaid: the values the factory took itself.
        self.param_defaults = {name: json_value(value) for name, value in sig.defaults
                               if name in sig.user_params and name not in given}
        check_takes(sig, kwargs)
        return {k: v for k, v in kwargs.items() if sig.takes(k)}

    def loss(self, forward):
        inputs = self.inputs
        output = call(forward, inputs)
        if self.work.loss_fn is not None:
            loss = self.work.loss_fn(output, inputs)
        else:
            loss = getattr(output, "loss", output)
            if isinstance(output, dict) and "loss" in output:
                loss = output["loss"]
        return checked_loss(loss, self.setup.model)

    def layers(self, needed_by: str):
        if not self._blocks:
            from stepbench.measure.options import Unsupported

            named = self.work.block.__name__ if self.work.block is not None else None
            raise Unsupported(no_blocks(needed_by, self.setup.model, named))
        return self._blocks

    def shard_units(self):
        """The blocks of the class the Workload names (`block`), else none: FSDP2 then shards
        the root alone, as one unit (guessing the block could split what must stay whole)."""
        block = self.work.block
        return (list(self._blocks) if block is not None else [],
                block.__name__ if block is not None else None)

    def enable_checkpointing(self) -> None:
        from torch.utils.checkpoint import checkpoint

        for block in self.layers("--checkpointing on"):
            forward = block.forward

            def checkpointed(*args, _forward=forward, **kwargs):
                if not self.recompute:          # counting the model's FLOPs (count_flops)
                    return _forward(*args, **kwargs)
                return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

            block.forward = functools.wraps(forward)(checkpointed)

    def make_optimizer(self, setup):
        if self.work.optimizer is not None:
            from stepbench.axes import axis

            if setup.optimizer not in axis("optimizer").plain:  # fused, the default, asks nothing
                from stepbench.measure.options import Unsupported

                raise Unsupported(f"--optimizer {setup.optimizer}: {setup.model}'s Workload "
                                  "builds its own optimizer, which is what runs; drop --optimizer")
            return self.work.optimizer(self.model.parameters())
        return super().make_optimizer(setup)

    def record_fields(self) -> dict:
        """The unit, and the repeated blocks found: their count and class (the one the
        Workload names, else the one found; none where neither)."""
        block = self.work.block or (type(self._blocks[0]) if self._blocks else None)
        blocks = {"count": len(self._blocks), **({"class": block.__name__} if block else {})}
        return {"units": self.units, "units_per_step": self.units_per_batch, "blocks": blocks,
                **({"param_defaults": self.param_defaults} if self.param_defaults else {})}

    def flop_fields(self, setup, units_per_s: float, peak_tflops_measured, count: bool) -> dict:
        """FLOPs per step from the workload, else FlopCounterMode's count of one step (a
        distributed job's: the single-process setup's, cached); achieved TFLOP/s and MFU from
        them. Without a count (a search's probe, the counter failed, a distributed job without
        the cached count) the fields stay empty and a note says why: the measurement is still
        ok."""
        import torch

        from stepbench.measure import flops, machine, options
        from stepbench.measure.peaks import datasheet_peak

        fields: dict = {"notes": []}
        per_step, source = self.work.flops_per_step, "workload"
        if per_step is None and setup.distributed:
            per_step = self.single_process_count(setup, fields["notes"])
            if per_step is not None:
                source = "flop_counter"
                fields["flop_counter_per_step"] = per_step
        elif per_step is None:
            try:
                with torch.compiler.set_stance("force_eager"), options.forward_context(setup):
                    # Cached per machine (flopcache.py): the first process of a setup counts.
                    per_step = flopcache.counted(
                        flopcache.key(setup, self.factory, self.work, self.inputs),
                        self.count_flops, count)
                source = "flop_counter"
                fields["flop_counter_per_step"] = per_step
            except Exception as exc:  # noqa: BLE001 - MFU must not cost the measurement
                print(f"stepbench: FlopCounterMode failed: {exc}", file=sys.stderr)
                fields["notes"].append(f"FLOPs not counted: FlopCounterMode failed "
                                       f"({type(exc).__name__}); no MFU")
                per_step = None
            if per_step is None and not count and not fields["notes"]:
                fields.pop("flop_counter_per_step", None)
                fields["notes"].append("FLOPs not counted in a search's probe; no MFU")
        if not per_step:
            if per_step is not None:
                fields["notes"].append("FlopCounterMode counted no FLOPs; no MFU")
            return fields
        steps_per_s = units_per_s / self.units_per_batch
        achieved = flops.achieved_tflops(float(per_step), steps_per_s)
        peak = datasheet_peak(machine.gpu_name(setup.device), setup.compute_dtype)
        fields.update({"flops_per_step": float(per_step), "flops_source": source,
                       "achieved_tflops": achieved, "peak_tflops_datasheet": peak,
                       "peak_tflops_measured": peak_tflops_measured,
                       "mfu_datasheet": flops.mfu(achieved, peak),
                       "mfu_measured": flops.mfu(achieved, peak_tflops_measured)})
        return fields

    def single_process_count(self, setup, notes: list) -> float | None:
        """A distributed job's FLOPs per (rank) step: FlopCounterMode's count of the same model
        and per-rank batch that a single-process setup cached on this machine (flopcache.py),
        else None; `notes` says which. A rank never counts: DDP's reducer hooks fire on a backward
        run outside its forward, and FSDP2's ranks would all have to count together (its
        gathers are collectives) where one rank may find the count cached and another not."""
        try:
            per_step = flopcache.counted(
                flopcache.key(setup, self.factory, self.work, self.inputs), None, may_count=False)
        except Exception as exc:  # noqa: BLE001 - MFU must not cost the measurement
            print(f"stepbench: reading the FLOP cache failed: {exc}", file=sys.stderr)
            per_step = None
        if per_step is None:
            notes.append("FLOPs not counted in a distributed job: measure `--parallel none` of "
                         "this model on this machine first (its count is cached), or give "
                         "flops_per_step in the factory; no MFU")
        else:
            notes.append("FLOPs per step counted by FlopCounterMode in a single-process run of "
                         "this model and per-rank batch on this machine (its cached count)")
        return per_step

    recompute = True    # checkpointed blocks recompute their forward in the backward

    def count_flops(self) -> float:
        """FLOPs of one forward + backward of this batch, as FlopCounterMode counts them
        (matrix products), without checkpointing's recompute: the model's FLOPs, which MFU
        counts, not the hardware's (a checkpointed setup counted a third more, and its MFU
        read higher for the same work); gradients and the RNG are left as they were."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        model = self.model
        params = [p for p in model.parameters() if p.requires_grad]
        saved = [p.grad for p in params]
        for p in params:
            p.grad = None
        cuda = self.setup.device == "cuda"
        self.recompute = False
        try:
            with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []), \
                    FlopCounterMode(display=False) as counter:
                self.loss(model).backward()
            return float(counter.get_total_flops())
        finally:
            self.recompute = True
            for p, grad in zip(params, saved):
                p.grad = grad


def json_value(value):
    """A literal default as JSON holds it: numbers, text, true/false, null and lists of them
    as they are; anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return repr(value)


def spread(inputs) -> tuple[tuple, dict, str]:
    """How the step passes a batch to forward: (args, kwargs, the call in words): `**inputs`
    (a dict), `*inputs` (a tuple or list) or `inputs` itself."""
    if isinstance(inputs, dict):
        return (), inputs, "model(**batch)"
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}, "model(*batch)"
    return (inputs,), {}, "model(batch)"


def call(forward, inputs):
    """`forward` called with the batch `inputs` as the step calls it (`spread`)."""
    args, kwargs, _ = spread(inputs)
    return forward(*args, **kwargs)


def materialize_lazy(model, inputs) -> None:
    """A model with lazy modules (nn.LazyLinear, nn.LazyConv2d) has no weights until its first
    forward: one forward of the batch, without gradients, makes them, in the dtype and on the
    device the model was given, before anything counts, wraps or optimizes its parameters (as
    a training script's dry run does). Other models are left untouched."""
    import torch
    from torch.nn.parameter import is_lazy

    if any(is_lazy(t) for t in (*model.parameters(), *model.buffers())):
        with torch.no_grad():
            call(model, inputs)


def check_takes(sig: Signature, kwargs: dict) -> None:
    """What the parent checks before any process (workload/plan.py), checked again here for a
    factory it could not read (its module not importable there, spec.Signature.checked)."""
    if not sig.takes("batch_size"):
        raise WorkloadError(no_batch_size(sig.model))
    for name in kwargs:
        if name in PASSED or sig.takes(name):
            continue
        if name in DECLARABLE_AXES:
            raise WorkloadError(not_an_axis(sig.model, f"--{name}", DECLARABLE_AXES[name]))
        raise WorkloadError(no_such_param(sig, name))
    for name in sig.required:
        if name not in kwargs:
            raise WorkloadError(no_default(sig.model, name))


def as_workload(made, model: str) -> Workload:
    """What the factory returned, as a Workload: `(model, make_batch)` or a Workload (or an
    object with the same attributes)."""
    if isinstance(made, Workload):
        return made
    if isinstance(made, tuple) and len(made) == 2 and callable(made[1]):
        return Workload(model=made[0], make_batch=made[1])
    if hasattr(made, "model") and hasattr(made, "make_batch"):
        names = [f for f in Workload.__dataclass_fields__ if hasattr(made, f)]
        return Workload(**{f: getattr(made, f) for f in names})
    raise WorkloadError(f"{model} returned {type(made).__name__}; return (model, make_batch) or "
                        "stepbench.Workload(model=..., make_batch=...)")


def check_workload(work: Workload, model: str) -> None:
    """Each part of what the factory returned is of the kind the step uses, else one line that
    names the part and the fix (not a TypeError from deep inside the step)."""
    import torch

    if not isinstance(work.model, torch.nn.Module):
        raise WorkloadError(f"{model} returned a model of type {type(work.model).__name__}; "
                            "return a torch.nn.Module")
    for name in ("make_batch", "loss_fn", "optimizer"):
        value = getattr(work, name)
        if not (callable(value) or (value is None and name != "make_batch")):
            raise WorkloadError(f"{model}'s {name} is a {type(value).__name__}, not a function; "
                                f"pass a function ({name}=lambda ...)")
    if work.block is not None and not isinstance(work.block, type):
        raise WorkloadError(f"{model}'s Workload names block={work.block!r}, not a class; pass "
                            "the class itself (block=Block)")
    # A count the record and the report can hold: a rate or MFU below zero is not one.
    for name, kinds in (("units_per_batch", (int,)), ("flops_per_step", (int, float))):
        value = getattr(work, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)
                                  or not value > 0):
            what = "a whole number" if kinds == (int,) else "a number"
            raise WorkloadError(f"{model}'s Workload gives {name}={value!r}; give {what} above "
                                "0, or None for stepbench's own")
    if work.units is not None and (not isinstance(work.units, str) or not work.units):
        raise WorkloadError(f"{model}'s Workload gives units={work.units!r}; name what a batch "
                            "holds (units=\"images\")")


def check_call(module, inputs) -> None:
    """The batch fits the model's forward as the step calls it (`spread`), else one line that
    says how it was called and the fix: a `(images, labels)` tuple for a `forward(x)` raised
    "forward() takes 2 positional arguments but 3 were given" from inside the first step."""
    import inspect

    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):         # a forward Python cannot read: the step will tell
        return
    args, kwargs, how = spread(inputs)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        kind = f"{type(inputs).__name__} of {len(inputs)}" if isinstance(
            inputs, (dict, tuple, list)) else type(inputs).__name__
        forward = f"{type(module).__name__}.forward({', '.join(signature.parameters)})"
        raise WorkloadError(
            f"{forward} cannot take make_batch's {kind} as {how}; return forward's arguments "
            f"alone (labels go in a loss_fn): {exc}") from None


def check_devices(inputs, device, model: str) -> None:
    import torch

    want = torch.device(device).type
    for tensor in tensors_in(inputs):
        if tensor.device.type != want:
            raise WorkloadError(f"make_batch returned a tensor on {tensor.device.type} for a model "
                                f"on {want}; make the batch on the `device` {model} is given")


def cast_floats(inputs, dtype):
    """The batch with its floating-point tensors in `dtype` (None: as they are)."""
    import torch

    if dtype is None:
        return inputs
    if torch.is_tensor(inputs):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, dict):
        return {k: cast_floats(v, dtype) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(cast_floats(v, dtype) for v in inputs)
    return inputs


def checked_loss(loss, model: str):
    import torch

    if not torch.is_tensor(loss):
        raise WorkloadError(f"{model}'s model returned {type(loss).__name__}, not a loss tensor; "
                            "return a scalar loss, an object with .loss, or give a loss_fn")
    if loss.ndim != 0:
        raise WorkloadError(f"{model}'s loss has shape {tuple(loss.shape)}, not a scalar; "
                            "reduce it (loss.mean()) or give a loss_fn that does")
    if not loss.requires_grad:
        raise WorkloadError(f"{model}'s loss has no grad (requires_grad is False); compute it "
                            "from the model's output")
    return loss


def find_blocks(model, block: type | None) -> list:
    """The model's repeated blocks: instances of `block`, else of the class that occurs most
    often (twice or more) as an element of the model's ModuleLists and Sequentials."""
    import torch

    if block is not None:
        return [m for m in model.modules() if isinstance(m, block)]
    counts: dict[type, int] = {}
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            for child in module:
                if any(True for _ in child.children()):
                    counts[type(child)] = counts.get(type(child), 0) + 1
    if not counts or max(counts.values()) < 2:
        return []
    common = max(counts, key=counts.get)
    return [m for m in model.modules() if type(m) is common]
