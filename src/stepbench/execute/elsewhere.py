"""A factory whose package is importable where the setups run but not here (`--model
package.module:make` on SSH hosts, Ray, Slurm, rented machines): its signature is read there,
before any setup starts, so that `--param`, a parameter without a default and an axis it cannot
take are refused in one line as on this machine (workload/plan.py).

A backend that can run a short command where its setups run says where (`Backend.reads_signatures`)
and its site reads it (`Site.read_signatures`: workload/sigreader.py run there), now or, for
machines the run creates (rented ones), on the first one prepared (`LATER`: the site then calls
`take` before any setup's job; each other machine must agree, hosts/firstread.py); one that
cannot, or a read that got no answer, takes the factory unread, says so once, and each setup's
process checks what it is given (workload/factory.py `check_takes`). A run on this machine keeps
the error that names the fix.
"""

from __future__ import annotations

from contextlib import contextmanager

from stepbench.errors import UserError
from stepbench.workload import sigreader, spec
from stepbench.workload.loader import is_factory, split


def not_here(settings) -> list[str]:
    """The `package.module:FUNCTION` models of `settings` whose module this machine cannot import."""
    models = settings.values.get("model")
    models = models if isinstance(models, (tuple, list)) else (models,)
    return [m for m in dict.fromkeys(models)
            if is_factory(m) and not spec.importable_here(m)]


# A site's answer for a factory it reads once its machine exists, before any setup's job there.
LATER = ("later",)


def unread_line(model: str, where: str | None, why: str | None = None) -> str:
    """What a run says of a factory it did not read here (`why`: a read that got no answer)."""
    module = split(model)[0]
    then = (f"a run reads it {where}, before any setup starts (a dry run contacts nothing)"
            if where else "it is read where the setups run")
    return (f"signature not checked here: module {module} is not importable on this machine; "
            f"{then}" + (f" ({why})" if why else ""))


def take(model: str, where: str, fields: dict) -> str:
    """Use the signature `fields` (read `where`) for `model` from now on, or raise the one-line
    UserError they carry; the line that says it was read."""
    spec.read_elsewhere(signature_of(model, where, fields))
    return (f"read the signature of {model} {where} (module {split(model)[0]} is not "
            "importable on this machine)")


class Away:
    """The factories of one command whose module is not importable here."""

    def __init__(self, backend, settings, say):
        self.backend, self.say = backend, say
        self.models = not_here(settings) if backend.remote else []
        self.where = backend.reads_signatures(settings) if self.models else None
        for model in self.models:       # until read: the checks that need no machine pass them
            spec.read_elsewhere(spec.unchecked(model))

    def dry_run(self) -> None:
        for model in self.models:
            self.say(f"dry run: {unread_line(model, self.where)}")

    def read(self, settings, site) -> None:
        """Read each factory's signature where the setups run (the site), before any of them
        starts; else say, once each, that it goes unchecked (and why, where the site says)."""
        if not self.models:
            return
        read = site.read_signatures(settings, self.models) if self.where else None
        for model in self.models:
            found = (read or {}).get(model)
            if found is LATER:
                continue
            if not isinstance(found, tuple):
                self.say(unread_line(model, None, found))
                continue
            self.say(take(model, *found))


def signature_of(model: str, where: str, fields: dict) -> spec.Signature:
    """The Signature `fields` (sigreader.parse's) give, or the one-line error they carry."""
    module = split(model)[0]
    kind = fields.get("error")
    if kind == "missing":
        raise UserError(f"--model {model}: no module {module!r} here or {where}; install it "
                        "there (or add its folder to PYTHONPATH there: --remote-setup 'export "
                        "PYTHONPATH=DIR' on SSH hosts), or pass FILE.py:FUNCTION (with "
                        "--workload-dir for the folder it imports from)")
    if kind == "syntax":
        raise UserError(f"{fields['path']}:{fields['line']} ({where}): syntax error "
                        f"({fields['msg']}); fix the module that --model {model} names")
    if kind == "nofunc":
        names = fields.get("defined") or []
        hint = f"; it defines: {', '.join(names)}" if names else ""
        raise UserError(f"{fields['path']} ({where}) has no function {split(model)[1]!r}{hint}; "
                        f"fix --model {module}:FUNCTION")
    if kind is not None:
        raise UserError(f"--model {model}: importing {module} {where} failed "
                        f"({fields.get('why')}); fix the module")
    return spec.from_fields(model, fields)


def agreed(model: str, answers: list[tuple[str, dict]], what: str = "host") -> tuple[str, dict]:
    """One answer from several machines' (`(name, fields)` each, `what` they are): all must
    read the same. Returns (where, in words, fields)."""
    first_name, first = answers[0]
    for name, fields in answers[1:]:
        if fields != first:
            raise UserError(f"--model {model} differs on {what} {first_name} and {name} (one "
                            "lacks it, or another version is installed); install the same one "
                            "on every machine")
    names = [name for name, _ in answers]
    where = (f"on {what} {names[0]}" if len(names) == 1
             else f"on {what}s {', '.join(names[:-1])} and {names[-1]}")
    return where, first


@contextmanager
def factories(backend, settings, say):
    """The command's factories not importable here, for `backend`; forgotten at the end."""
    try:
        yield Away(backend, settings, say)
    finally:
        spec.forget_elsewhere()


__all__ = ["LATER", "Away", "agreed", "factories", "not_here", "signature_of", "sigreader",
           "take"]
