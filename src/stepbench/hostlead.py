"""How far the GPU finishes each timed step behind the host that launched it (the host's lead),
and whether a setup is host-bound by that measure: a cheap mark without `--profile`.

Per timed step the child takes the host's clock right after the step's work is enqueued (its
end event recorded, no synchronize) and the GPU's end event; an anchor event, recorded on an
idle GPU just after a synchronize and bracketed by two host clock readings, puts both on one
clock. The lead is the GPU's end minus the host's. When the GPU is the bottleneck the host runs
ahead until the launch queue is full, and the lead is a large share of a step; when the host is,
the GPU runs each kernel right after its launch and finishes each step right after the host
has launched its last kernel, and the lead is the last kernels' time. A host-bound setup's speed
is the host's CPU speed as much as the GPU's. No torch here: the report reads the threshold.
"""

from __future__ import annotations

import statistics
from typing import Sequence

# host_bound when the median lead is below this share of the median step: the GPU never had
# more than a twentieth of a step queued when the host finished launching one. A GPU-bound
# step keeps CUDA's launch queue full (on the order of a thousand pending launches), about a
# third of a step of 3,110 kernels (llama-468m eager+sdpa on an H200, benchmarks/README.md
# section l2); a host-bound one leaves its last kernels' time, well under a twentieth. Not yet
# checked on a GPU against the profile's busy share: benchmarks/gpu_wander.py does that.
HOST_BOUND_SHARE = 0.05


def host_leads(anchor_s: tuple[float, float], ends_after_anchor_ms: Sequence[float],
               enqueued_s: Sequence[float]) -> dict:
    """The record's host-lead fields from one timed window.

    `anchor_s`: the host clock (perf_counter, s) just before the anchor event was recorded on
    an idle GPU and just after it was seen complete: the anchor's GPU time lies between them,
    taken at the midpoint, the half-width its uncertainty. `ends_after_anchor_ms`: each step's end
    event, ms after the anchor (CUDA's elapsed_time). `enqueued_s`: the host clock when each
    step's work had been enqueued.
    """
    before, after = anchor_s
    anchor = (before + after) / 2
    leads = [(anchor + end / 1000 - host) * 1000
             for end, host in zip(ends_after_anchor_ms, enqueued_s, strict=True)]
    return {"host_lead_ms": statistics.median(leads) if leads else None,
            "host_lead_steps_ms": [round(v, 3) for v in leads],
            "host_lead_offset_ms": (after - before) / 2 * 1000}


def host_bound(lead_ms: float | None, step_ms_median: float | None,
               share: float = HOST_BOUND_SHARE) -> bool:
    """Whether a median lead of `lead_ms` says the host bounds a step of `step_ms_median`: the
    lead below `share` of the step. No lead (a CPU, nothing measured) says nothing."""
    if lead_ms is None or not step_ms_median:
        return False
    return lead_ms < share * step_ms_median
