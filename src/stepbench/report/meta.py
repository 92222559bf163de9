"""What a report's records measured: the models, batch x sequence, precisions, machines,
software versions and dates, said once at the top of every format (a header in the table,
Markdown and HTML, a `meta` object in JSON; CSV has them per row).

A report read weeks later, or forwarded, must say what it is about without the results files
beside it. `run`'s end table titles itself the same way (`title`).
"""

from __future__ import annotations

from datetime import datetime, timezone

from stepbench.record import Record


def title(models: list[str], dtypes: list[str], where: str, batch_seq: list[str] = ()) -> str:
    """"llama-468m, batch 4 x 2048, bf16, on NVIDIA H200": model(s), batch x sequence (when
    given), precision(s) and the machine(s)."""
    parts = [_join(models)]
    if batch_seq:
        parts.append("batch " + shapes(batch_seq))
    parts.append(", ".join(dtypes))
    return ", ".join(parts) + f", on {where}"


# More batch sizes of one sequence length than this read as a range (a max-batch search's).
SHAPES_LISTED = 4


def shapes(batch_seq: list[str]) -> str:
    """Batch sizes of one sequence length in numeric order, not the order the records were
    written in (a max-batch search's probes: 4, 8, 16, 32, 64, 48, 40, ...), and more than
    SHAPES_LISTED of them as their range: "4 to 64 x 2048 (15 sizes)". Shapes of several
    sequence lengths keep their order (that of the models, "gpt and resnet, 8 x 1024 and 128")."""
    def key(shape: str) -> tuple:
        batch, _, seq = shape.partition(" x ")
        return (int(batch) if batch.isdigit() else 0, shape)
    if len({s.partition(" x ")[2] for s in batch_seq}) > 1:
        return _join(batch_seq)
    ordered = sorted(batch_seq, key=key)
    if len(ordered) > SHAPES_LISTED:
        low, high = ordered[0].partition(" x ")[0], ordered[-1].partition(" x ")[0]
        tail = ordered[0].partition(" x ")[2]
        return f"{low} to {high}{' x ' + tail if tail else ''} ({len(ordered)} sizes)"
    return _join(ordered)


def measured(records: list[Record]) -> dict:
    """The JSON `meta` object: each list in order of appearance, versions as recorded (and in
    `unrecorded`, how many records carry none, where some do not), the first and last
    `started_at` of the records."""
    started = sorted((s, r.started_at) for r in records
                     if (s := _when(r.started_at)) is not None)
    unrecorded = {name: sum(getattr(r.software, name) is None for r in records)
                  for name in SOFTWARE}
    return {
        "models": _unique(r.setup.model_label for r in records),
        "batch_seq": _unique(r.setup.shape for r in records),
        "dtypes": _unique(r.setup.dtype for r in records),
        "gpus": _unique(r.machine.name for r in records),
        "torch": _unique(r.software.torch for r in records),
        "transformers": _unique(r.software.transformers for r in records),
        "stepbench": _unique(r.software.stepbench for r in records),
        "started_first": started[0][1] if started else None,
        "started_last": started[-1][1] if started else None,
        "records": len(records),
        "unrecorded": {name: n for name, n in unrecorded.items() if n},
    }


SOFTWARE = ("torch", "transformers", "stepbench")


def header(meta: dict) -> list[str]:
    """Two lines: what was measured (with how many records and when), and the software."""
    what = title(meta["models"], meta["dtypes"], _join(meta["gpus"]), meta["batch_seq"])
    when = dates(meta["started_first"], meta["started_last"])
    records = f"{meta['records']:,} record{'s' if meta['records'] != 1 else ''}"
    software = ", ".join(_version(name, meta) for name in SOFTWARE)
    return [f"Measured: {what} ({records}, {when})", f"Software: {software}"]


def _version(name: str, meta: dict) -> str:
    """"torch 2.11.0", "stepbench not recorded", "stepbench 0.1.0 (not recorded in 16)"."""
    if not meta[name]:
        return f"{name} not recorded"
    missing = meta.get("unrecorded", {}).get(name)
    return f"{name} {_join(meta[name])}" + (f" (not recorded in {missing})" if missing else "")


def dates(first: str | None, last: str | None) -> str:
    """"2026-11-30 10:15-10:17 UTC", "2026-10-29 09:00 UTC to 2026-11-30 10:17 UTC", or that
    the records carry no start time."""
    a, b = _when(first), _when(last)
    if a is None or b is None:
        return "start times not recorded"
    if a.date() == b.date():
        span = a.strftime("%H:%M") if a.strftime("%H:%M") == b.strftime("%H:%M") else \
            f"{a:%H:%M}-{b:%H:%M}"
        return f"{a:%Y-%m-%d} {span} UTC"
    return f"{a:%Y-%m-%d %H:%M} UTC to {b:%Y-%m-%d %H:%M} UTC"


def row_fields(records: list[Record]) -> dict:
    """A row's own versions and dates, for its JSON object and CSV line: each version as
    recorded ("; " between several), the first and last start of its records."""
    started = sorted((s, r.started_at) for r in records
                     if (s := _when(r.started_at)) is not None)
    return {
        "torch": "; ".join(_unique(r.software.torch for r in records)) or None,
        "transformers": "; ".join(_unique(r.software.transformers for r in records)) or None,
        "stepbench_version": "; ".join(_unique(r.software.stepbench for r in records)) or None,
        "started_first": started[0][1] if started else None,
        "started_last": started[-1][1] if started else None,
    }


def _when(text: str | None) -> datetime | None:
    """An ISO-8601 time in UTC (a time without a zone is taken as UTC); None if unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _unique(values) -> list:
    return [v for v in dict.fromkeys(values) if v is not None]


def _join(items: list[str]) -> str:
    items = list(items)
    if not items:
        return "-"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
