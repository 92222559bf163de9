"""FlopCounterMode's count of a factory's step, cached per machine like the HF path's
(workload/hf.py `flop_counter_per_sequence`), so that only the first process of a setup pays for
the counting pass (on a 2-core CPU most of what a factory's process cost beyond the HF path's).

A factory is code stepbench cannot see into, so the key holds everything the count could depend
on, and a count is stored only where that key can be told:
* the code: a digest of the factory's file and of every other file the step's code comes from
  (the classes of the model's modules, make_batch, loss_fn, the modules imported from the
  factory's own folder or package), plus the software's versions (Python, torch,
  transformers, stepbench, CUDA);
* the setup: every Setup field except those that cannot change what FlopCounterMode counts
  (`IGNORED`: the count runs eagerly, before any optimizer step, on one process), so a new axis
  is in the key until someone argues it out;
* what was built: the batch's tensor shapes and dtypes, and the parameters' names, shapes and
  dtypes as the model defines them, however it was wrapped: a DDP or FSDP2 rank of a job computes
  the key of the single-process setup with its per-rank batch, and reads the count that setup
  cached (a rank never counts: factory.py `FactoryBuilt.single_process_count`). FSDP2's sharded
  parameters (DTensors) give their global shapes, its classes made on the fly (`FSDP<Block>`)
  and a layer compiled in its place (`OptimizedModule`, `_orig_mod.` in the names) give the
  model's own.
A factory file changed on disk since it was imported (the process server imports it once per
run) gives no key: counted, never stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import sys
from pathlib import Path

from stepbench.workload.base import tensors_in

# Setup fields that cannot change the count: how the step is compiled, timed, stepped and spread
# (a distributed setup's rank reads the single-process setup's count), and where its memory limit
# sits.
IGNORED = frozenset({"mode", "compile_mode", "compile_scope", "optimizer", "warmup", "steps",
                     "checkpointing",     # counted without its recompute (FactoryBuilt.count_flops)
                     "memory_limit_gb", "nproc", "nnodes", "parallel", "fsdp_reshard",
                     "fsdp_unit", "fsdp_prefetch", "fsdp_optimizer"})


def _cache():
    from stepbench.measure.cache import JsonCache

    return JsonCache("factory_flops")


def code_files(factory, work, module) -> list[Path]:
    """The files the step's code comes from (see the module's docstring), sorted."""
    files = {inspect.getsourcefile(factory) or ""}
    for m in work.model.modules():
        files.add(_file_of(model_class(m)))
    for fn in (work.make_batch, work.loss_fn, work.optimizer, work.block):
        files.add(_file_of(fn))
    module_file = getattr(module, "__file__", None)
    if module_file:
        root = Path(module_file).resolve().parent
        package = (getattr(module, "__package__", None) or "").split(".")[0]
        if package and package in sys.modules and getattr(sys.modules[package], "__file__", None):
            root = Path(sys.modules[package].__file__).resolve().parent
        # A prefix test first: resolving each of the ~3,000 modules torch and transformers load
        # took 0.2 s on a 2-core CPU, most of what the cache saves there.
        prefixes = tuple({str(root) + os.sep, str(Path(module_file).parent) + os.sep})
        for loaded in list(sys.modules.values()):
            path = getattr(loaded, "__file__", None)
            if isinstance(path, str) and path.startswith(prefixes) and not installed(path):
                files.add(path)
    return sorted({Path(f).resolve() for f in files if f and Path(f).is_file()})


def installed(path: str) -> bool:
    """A file of an installed distribution or of stepbench itself (a venv inside the factory's
    folder): its version is in the key, its thousands of files need not be read."""
    parts = Path(path).parts
    return "site-packages" in parts or "dist-packages" in parts or \
        Path(path).resolve().is_relative_to(Path(__file__).resolve().parent.parent)


def model_class(module) -> type | None:
    """The class the model's code gave `module`: FSDP2's `fully_shard` swaps in a subclass made on
    the fly (from torch's file), a layer compiled in its place is an OptimizedModule holding the
    original (`_orig_mod`, also among the modules: None here); neither is the model's code."""
    cls = type(module)
    # Neither can be there unless its module was imported.
    dynamo, fsdp = (sys.modules.get(name) for name in ("torch._dynamo.eval_frame",
                                                       "torch.distributed.fsdp"))
    if dynamo is not None and issubclass(cls, dynamo.OptimizedModule):
        return None
    if fsdp is not None and issubclass(cls, fsdp.FSDPModule):
        return next(c for c in cls.__mro__ if not issubclass(c, fsdp.FSDPModule))
    return cls


def parameter_name(name: str) -> str:
    """A parameter's name without the `_orig_mod.` a layer compiled in its place adds."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def _file_of(thing) -> str:
    if thing is None:
        return ""
    try:
        return inspect.getsourcefile(thing) or ""
    except TypeError:          # a builtin, a lambda's closure over a C function, ...
        try:
            return inspect.getsourcefile(type(thing)) or ""
        except TypeError:
            return ""


def key(setup, factory, work, inputs) -> dict | None:
    """The cache key of this built factory's count; None where it cannot be told (see the
    module's docstring): then it is counted, never stored, and the measurement goes on."""
    try:
        return _key(setup, factory, work, inputs)
    except (TypeError, OSError, AttributeError):  # a callable without a source file, ...
        return None


def _key(setup, factory, work, inputs) -> dict | None:
    from stepbench.measure import machine
    from stepbench.workload.loader import digest, loaded_digest

    module = sys.modules.get(factory.__module__)
    source = inspect.getsourcefile(factory)
    if source is None or loaded_digest(module) not in (None, digest([Path(source).resolve()])):
        return None
    code = digest(code_files(factory, work, module))
    fields = {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)
              if f.name not in IGNORED}
    # A DTensor's shape is the global one: an FSDP2 rank's shard gives the whole parameter's.
    shapes = hashlib.sha256(repr([(parameter_name(name), tuple(p.shape), str(p.dtype),
                                   p.requires_grad)
                                  for name, p in work.model.named_parameters()]).encode())
    return {"factory": f"{Path(source).resolve()}:{factory.__name__}", "code": code,
            "setup": fields,
            "inputs": [[list(t.shape), str(t.dtype)] for t in tensors_in(inputs)],
            "parameters": shapes.hexdigest(),
            "software": machine.software_info()}


def counted(key_: dict | None, count, may_count: bool) -> float | None:
    """The cached count for `key_`, else `count()`'s (stored under it); without `may_count` (a
    search's probe) the cached count or None."""
    from stepbench.measure.cache import positive_number

    found = _cache().fetch(key_, count, valid=positive_number, cached_only=not may_count)
    return None if found is None else float(found[0])
