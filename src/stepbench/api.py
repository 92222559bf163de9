"""The Python API: `stepbench.api.run`, `.tune` and `.report` for notebooks and scripts, with
the commands' settings as keyword arguments.

Each call runs the command itself, `python -m stepbench COMMAND ... --format json`, in a
subprocess: the same settings, checks, processes and records as the command line, never an
in-process shortcut that would measure something else (a notebook's own imports, threads or
CUDA context in the measured process). Its progress lines go to this process's stderr as they
come. A keyword is the flag's name with underscores (`compile_mode="default,max-autotune"` is
`--compile-mode default,max-autotune`); a list is a comma list; True and False are on and off
for an axis, a bare switch for an option (`rerun=True`); `param={"width": [64, 128]}` is
`--param width=64,128`. Bad input raises UserError with the command's one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from stepbench.errors import UserError


class Results(list):
    """A list of records (the results file's JSON objects) with `.frame()`: a pandas DataFrame,
    one row per record, the setup's fields as columns beside the record's own."""

    def frame(self):
        try:
            import pandas
        except ImportError:
            raise UserError("Results.frame() needs pandas (pip install pandas); the records "
                            "themselves are this list") from None
        rows = []
        for record in self:
            row = {k: v for k, v in record.items() if k not in ("setup", "machine", "software")}
            row.update({f"setup.{k}": v for k, v in (record.get("setup") or {}).items()})
            row["gpu"] = (record.get("machine") or {}).get("gpu")
            rows.append(row)
        return pandas.DataFrame(rows)


def run(model: str | None = None, **settings) -> Results:
    """`stepbench run`: measure the setups the settings expand to; the records of this plan
    (stored ones it resumed included), as `stepbench run --format json` prints them."""
    out = _call("run", _flags(dict(settings, model=model)))
    return Results(json.loads(out) if out.strip() else [])


def tune(model: str | None = None, budget: str = "10m", **settings) -> dict:
    """`stepbench tune`: the tune's result object (winner, runner_up, ... as `stepbench tune
    --format json` prints it)."""
    return json.loads(_call("tune", _flags(dict(settings, model=model, budget=budget))))


def report(*files, **settings) -> dict:
    """`stepbench report FILES`: {"rows": [...], "findings": [...], "notes": [...], ...};
    `.frame()` of the rows is `pandas.DataFrame(result["rows"])`."""
    if not files:
        raise UserError("stepbench.api.report() needs one or more results files")
    return json.loads(_call("report", [*map(str, files), *_flags(settings)]))


def _flags(settings: dict) -> list[str]:
    from stepbench.axes import by_key

    flags: list[str] = []
    for key, value in settings.items():
        if value is None or key == "format":
            continue
        flag = "--" + key.replace("_", "-")
        if key == "param":
            items = value.items() if isinstance(value, dict) else None
            if items is None:
                raise UserError("param= takes a dict: {NAME: [V1, V2]}")
            for name, values in items:
                values = values if isinstance(values, (list, tuple)) else [values]
                flags += ["--param", f"{name}={','.join(map(str, values))}"]
            continue
        axis = by_key(key)
        if isinstance(value, bool) and (axis is None or axis.kind is not bool):
            flags += [flag] if value else []        # a switch: --rerun, --dry-run
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        text = ",".join(("on" if v else "off") if isinstance(v, bool) else str(v) for v in values)
        flags += [flag, text]
    return flags


def _as_keywords(command: str, message: str) -> str:
    """The command line's "unrecognized arguments: --bogus-kw 3" as the keywords a script
    passed: "stepbench.api.run() takes no keyword bogus_kw; ..."."""
    head, found, rest = message.partition("unrecognized arguments: ")
    if not found:
        return message
    names = [word[2:].replace("-", "_") for word in rest.split(";")[0].split()
             if word.startswith("--")]
    if not names:
        return message
    return (f"stepbench.api.{command}() takes no keyword {', '.join(names)}; its keywords are "
            f"`stepbench {command}`'s flags with _ for - (stepbench {command} --help)")


def _call(command: str, flags: list[str]) -> str:
    """Run `python -m stepbench COMMAND FLAGS --format json`; its stdout. Progress (stderr) is
    passed on line by line; exit 2 (bad input) raises UserError with its message."""
    src = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src,
                                                                    os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "stepbench", command, *flags, "--format",
                             "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    last, kept = "", []
    # stdout is read beside stderr: a large JSON array must not fill its pipe while we wait.
    reader = threading.Thread(target=lambda: kept.append(proc.stdout.read()), daemon=True)
    reader.start()
    try:
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                last = line.strip()
        reader.join()
    finally:
        code = proc.wait()
    out = kept[0] if kept else ""
    if code == 2:
        raise UserError(_as_keywords(command, last.removeprefix(f"stepbench {command}: ")
                                     .removeprefix("error: ")))
    if code not in (0, 1):      # 1: some setup did not run (its record says why)
        raise RuntimeError(f"stepbench {command} exited with {code}: {last}")
    return out
