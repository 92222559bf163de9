"""What the parent checks of a plan's workloads before any process starts, and what a process
imports for them ahead of the build. Nothing here imports torch."""

from __future__ import annotations

from pathlib import Path

from stepbench.errors import UserError
from stepbench.workload.spec import is_factory, signature


def check_models(plan) -> None:
    """Every model of `plan`: a config file read and checked against its sequence lengths (a
    preset is known good, and checking it would import transformers); a factory's source read
    and its signature checked (workload/spec.py)."""
    from stepbench.workload import hf

    for model, seq in dict.fromkeys((s.model, s.seq) for s in plan):
        if is_factory(model):
            signature(model)
        elif model not in hf.PRESETS:
            hf.build_config(model, seq)


def import_modeling(model: str, seq: int) -> None:
    """Import what building `model` needs, so that a setup's "imports" phase holds the imports
    and its "build" phase the building alone; a factory's module is imported (what it imports
    with it: torchvision, its own modules). A factory that fails to import fails in the build,
    where the setup's record keeps the error."""
    if not is_factory(model):
        from stepbench.workload import hf

        hf.import_modeling(model, seq)
        return
    from stepbench.workload.loader import load_function

    try:
        load_function(model)
    except Exception:  # noqa: BLE001 - raised again, and recorded, by the build
        pass


def check_workload_dir(folder, model) -> Path | None:
    """--workload-dir, checked: a folder that holds the factory's file."""
    if folder is None:
        return None
    from stepbench.workload.loader import split

    folder = Path(folder)
    if not is_factory(model) or not split(model)[0].endswith(".py"):
        raise UserError("--workload-dir goes with --model FILE.py:FUNCTION (the folder that "
                        "file imports from); drop it")
    if not folder.is_dir():
        raise UserError(f"--workload-dir {folder} is not a folder; pass the folder that holds "
                        f"{split(model)[0]}")
    file = Path(split(model)[0]).resolve()
    if folder.resolve() not in file.parents:
        raise UserError(f"--workload-dir {folder} does not hold {split(model)[0]}; pass a folder "
                        "above the file")
    return folder
