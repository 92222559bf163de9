"""What a tune may vary: every searched axis's values this machine can run, narrowed by the
axis flags given, and the setup the search starts from."""

from __future__ import annotations

from stepbench.axes import AXES, axis
from stepbench.settings import SEARCHED
from stepbench.setup import Setup
from stepbench.workload.spec import is_factory

# What the tune may vary: axis name -> the values it searches, the start value first (the
# registry's axes with a `tune` stage, axes.AXES).
Space = dict


def default_space(device: str) -> tuple[Space, dict[str, list[str]]]:
    """Every value of every searched axis this machine can run, and, by axis, a note for each
    value left out and why."""
    space, notes = {}, {}
    for a in AXES:
        if a.tune in SEARCHED:
            space[a.name], notes[a.name] = a.searched(device)
    return space, notes


def space_for(settings) -> tuple[Space, list[str]]:
    """The search space of a tune's settings: what this machine runs, narrowed by the axis flags
    given (a narrowed axis has no notes: the flag chose its values). A value named on the
    command line that this machine cannot run is refused with the reason."""
    from stepbench.errors import UserError

    space, notes = default_space(settings.device)
    for name, values in settings.space.items():
        a = axis(name)
        for value in values:
            reason = a.why_not(value, settings.device)
            if reason is not None:
                fix = "" if "; use --" in reason else f"; drop it from {a.flag}"
                raise UserError(f"{a.flag} {a.text(value) or value} cannot run here: "
                                f"{reason}{fix}")
        space[name] = list(values)
        notes.pop(name)
    if is_factory(settings.values.get("model")):
        from stepbench.workload.plan import tune_params

        # A user's model takes no attention or fused kernels of transformers' (workload/plan.py).
        for name in ("attn", "kernels"):
            space[name], notes[name] = space[name][:1], []
        # Its own parameters: each combination of --param's values a candidate, the first
        # where the search starts.
        firsts = {name: values[0] for name, values in space.items()}
        space["params"] = list(tune_params({**settings.values, **firsts}))
    else:
        from stepbench.workload.plan import no_params

        no_params(settings.values)      # as run refuses it: a transformers model takes none
    return space, [text for texts in notes.values() for text in texts]


def start(settings, space: Space) -> Setup:
    """The setup a tune starts from: eager mode, each searched axis at its start value, the
    others as the settings hold them."""
    fields = {**settings.values, **{name: values[0] for name, values in space.items()}}
    if is_factory(fields.get("model")):
        from stepbench.workload.plan import one_setup_values

        fields = one_setup_values(fields)
    return Setup(**{**fields, "mode": "eager"}).check()
