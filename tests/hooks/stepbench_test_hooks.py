"""The wrappers that tests/hooks/sitecustomize.py installs, and the variables that arm them.

Imported by the tests too (for the variables' names): importing it installs nothing.
"""

import functools
import os
import sys
import time

DIVERGE_ENV = "STEPBENCH_TEST_DIVERGE"
FAULT_ENV = "STEPBENCH_TEST_FAULT"


def spoil_weights(apply_options):
    """apply_options, then the output embedding weights x 64 for the setup DIVERGE_ENV names."""

    @functools.wraps(apply_options)
    def apply_then_spoil(model, setup):
        model = apply_options(model, setup)
        if os.environ.get(DIVERGE_ENV) == setup.name:
            import torch    # already imported by measure/options, the module this wraps

            with torch.no_grad():
                model.get_output_embeddings().weight.mul_(64.0)
        return model

    return apply_then_spoil


def fail_on_entry(enter_phase):
    """enter_phase, then the fault FAULT_ENV asks for when this rank enters that phase; the
    phase is written first, so the parent reads where the rank failed."""

    @functools.wraps(enter_phase)
    def enter_then_fail(state, phase, *args):
        enter_phase(state, phase, *args)
        inject_fault(state.data["rank"], phase)

    return enter_then_fail


def inject_fault(rank: int, phase: str) -> None:
    target, kind, at = (os.environ.get(FAULT_ENV, "").split(":") + ["", "", ""])[:3]
    if target != str(rank) or at != phase:
        return
    if kind == "raise":
        raise RuntimeError(f"fault injected by the tests on rank {rank} in phase {phase}")
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        while True:
            time.sleep(60)


# module -> (function name, wrapper factory)
PATCHES = {
    "stepbench.measure.options": ("apply_options", spoil_weights),
    "stepbench.measure.distributed": ("enter_phase", fail_on_entry),
}


class PatchAfterImport:
    """A meta path finder that lets the other finders find a module of PATCHES, and wraps the
    function once the module's code has run (before anything can bind it by name)."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        function, wrapper = PATCHES[name]
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            setattr(module, function, wrapper(getattr(module, function)))

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if not any(isinstance(f, PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, PatchAfterImport())
