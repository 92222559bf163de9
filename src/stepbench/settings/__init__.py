"""A command's settings as one frozen, typed value, built and checked once: defaults, then the plan
file, then the flags. Every command and executor takes it; nothing below the CLI sees argparse.

Each setting is declared once, as a field of the settings dataclass with its metadata (declare.py):
its type, default (per command), flag, plan-file key, check, help and docs text. The flags
(cli/flags.py), the plan file's keys (plan.py) and docs/cli.md's flag table (cli/doc.py) are made
from the declarations. The setups' own fields (the axes) are declared in the registry (axes.py).

    common.py   what run and tune share (device, start, repeats, timeout, out, a cluster, ...)
    run.py      RunSettings (+ its parts: MaxBatchOptions, Remote, Rent)   tune.py  TuneSettings
    choices.py  the closed sets: Device, Start, Objective (StrEnums: their values print as-is)
    origin.py   where a value came from (a flag, a plan's key), for the errors; path checks
"""

from stepbench.errors import UserError
from stepbench.settings.choices import Device, Objective, Start
from stepbench.settings.common import (DEFAULT_OUT, DEFAULT_TUNE_OUT, DEVICE_CHOICES, GROUPS,
                                       Common)
from stepbench.settings.declare import (RUN, TUNE, Backend, Setting, chosen_backends, declared,
                                        part, setting)
from stepbench.settings.origin import Origin, read_file, read_hosts_file, writable_folder
from stepbench.settings.run import MaxBatchOptions, Remote, Rent, RunSettings
from stepbench.settings.tune import SEARCHED, TuneSettings, parse_budget

__all__ = ["UserError", "Device", "Objective", "Start", "DEFAULT_OUT", "DEFAULT_TUNE_OUT",
           "DEVICE_CHOICES", "GROUPS", "Common", "RUN", "TUNE", "Backend", "Setting",
           "chosen_backends", "declared", "part", "setting", "Origin", "read_file", "read_hosts_file",
           "writable_folder", "MaxBatchOptions", "Remote", "Rent", "RunSettings", "SEARCHED",
           "TuneSettings", "parse_budget"]
