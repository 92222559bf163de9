"""docs/results-schema.md documents exactly the fields of the Record type, its machine, software
and setup: a field added to the type without a line in the document (or the other way) fails."""

import dataclasses
import re
from pathlib import Path

from stepbench.record import Machine, Record, Software
from stepbench.setup import Setup

DOC = Path(__file__).parent.parent / "docs" / "results-schema.md"


def documented() -> dict[str, set[str]]:
    """Field names in the first column of each table, by section (top level, setup, machine...)."""
    found = {"record": set(), "setup": set(), "machine": set(), "software": set()}
    section = "record"
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = "setup" if "`setup`" in line else "record"
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([a-z_.]+)`", line.split("|")[1]):
            prefix, _, field = name.rpartition(".")
            found[prefix or section].add(field)
    return found


def names(kind) -> set[str]:
    return {f.name for f in dataclasses.fields(kind)}


def test_every_record_field_is_documented_and_nothing_else():
    doc = documented()
    assert doc["record"] == names(Record)
    assert doc["setup"] == names(Setup) | {"name"}
    assert doc["machine"] == names(Machine)
    assert doc["software"] == names(Software)


def test_the_fields_left_out_while_empty_are_the_ones_the_code_leaves_out():
    from stepbench.axes import AXES
    from stepbench.record import LATER_FIELDS

    text = DOC.read_text().split("Every field is present in every record, except")[1]
    listed = set(re.findall(r"`([a-z_]+)`", text.split("A number that was not")[0]))
    assert set(LATER_FIELDS) <= listed, "results-schema.md: fields a record leaves out while empty"
    assert {a.name for a in AXES if a.later} <= listed
