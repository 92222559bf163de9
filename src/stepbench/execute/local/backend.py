"""The local backend (registry.py): every setup's process on this machine, one GPU or a pool."""

from __future__ import annotations

from stepbench.errors import UserError
from stepbench.execute.registry import Backend, Note, Site


class LocalBackend(Backend):
    name = "local"
    # The executor a site makes (None: local/process.py's LocalProcess); tests give their own
    # through the `local_executor` fixture (tests/conftest.py).
    executor_class: type | None = None

    def chosen(self, settings) -> bool:
        return True         # asked last: what no other backend takes runs here

    def open(self, settings, note: Note) -> "LocalSite":
        return LocalSite(settings, note, self.executor_class)


class LocalSite(Site):
    """This machine: its device, its memory, its GPUs (`--gpus`: local/pool.py)."""

    def __init__(self, settings, say: Note, executor_class: type | None = None):
        if executor_class is None:
            from stepbench.execute.local.process import LocalProcess as executor_class
        self.executor_class = executor_class
        self.asked = settings           # as given: `auto` not yet resolved
        self.say = say                  # a line for the user before the progress starts
        self.cache = None
        self.gpus = self.rendezvous = None

    def device(self, settings) -> str:
        from stepbench.measure.machine import resolve_device

        return resolve_device(settings.device)

    def check(self, settings, plan: list) -> None:
        from stepbench.execute.local import pool
        from stepbench.settings import writable_folder

        if settings.device == "cpu" and settings.max_batch is None:
            check_memory(plan)
        if self.asked.device == "auto" and settings.device == "cpu":
            model = "" if self.asked.values["model"] else " with the llama-tiny preset"
            self.say(f"no CUDA GPU found; running on the CPU{model} (pass --device cuda on a GPU "
                     "machine)")
        self.cache = None if settings.compile_cache is None else \
            writable_folder(settings.compile_cache, "--compile-cache", make=True)
        if settings.profile is not None:
            writable_folder(settings.profile, "--profile", make=True)
        self.gpus = pool.gpu_pool(settings, plan)
        self.rendezvous = pool.rendezvous(settings, self.gpus, plan)

    def executor(self, settings, plan: list, note: Note):
        from stepbench.execute.local.server import imports_for

        return self.executor_class(compile_cache=self.cache, gpus=self.gpus,
                                   rendezvous=self.rendezvous, start=settings.start,
                                   preload=imports_for(plan), note=note)

    def check_tune(self, settings, base) -> None:
        from stepbench.measure.cache import cache_dir
        from stepbench.settings import writable_folder

        # Here it must be a folder this can write (tune keeps a warm cache by default).
        self.cache = writable_folder(settings.compile_cache or cache_dir() / "inductor",
                                     "--compile-cache", make=True)

    def tune_executor(self, settings, kinds: list, note: Note):
        from stepbench.execute.local.server import imports_for

        return self.executor_class(compile_cache=self.cache, start=settings.start, note=note,
                                   preload=imports_for(kinds))


def check_memory(plan) -> None:
    """On a CPU, refuse a plan with a setup whose step needs more memory than this machine has
    available (measure/footprint.py's floor), before its process grows until the kernel kills
    it. A setup capped by --memory-limit-gb below that fails with `oom` instead; --max-batch
    and tune probe sizes that may not fit on purpose, and are not checked."""
    from stepbench.execute.oom import available_bytes
    from stepbench.measure.footprint import estimate
    from stepbench.units import gigabytes

    available = available_bytes()
    over = []
    for setup in plan:
        if setup.memory_limit_gb is not None and setup.memory_limit_gb * 1e9 < available:
            continue
        floor = estimate(setup)
        if floor is not None and floor.total > available:
            over.append((floor.total, setup, floor))
    if not over:
        return
    total, setup, floor = max(over, key=lambda item: item[0])
    parts = ", ".join(f"{name} {gigabytes(value / 1e9)}" for name, value in floor.parts.items()
                      if value >= 0.01 * total)
    more = f" (and {len(over) - 1} more setup{'s' if len(over) > 2 else ''})" if len(over) > 1 \
        else ""
    raise UserError(f"{setup.name} at batch {setup.batch} x seq {setup.seq}{more} needs at least "
                    f"{gigabytes(total / 1e9)} of memory ({parts}), and this machine has "
                    f"{gigabytes(available / 1e9)} available; lower --seq or --batch (--max-batch "
                    "with --memory-limit-gb finds the largest batch that fits)")
