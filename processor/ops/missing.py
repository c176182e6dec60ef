"""Why a job's rows have no result yet, in words ``collect`` and ``jobs`` can print.

A collect that counts rows missing used to stop there, and a person waited on ``--wait`` until its
timeout. The reasons are read from what ``status`` reads (the contracts, every instance's last
checkpoint): the first that applies is the one to act on, so they come in that order.

1. No consumer serves the job's model: its items wait, parked, until one announces it.
2. No live processor: nothing is dispatched (none ever ran, or every instance's last checkpoint is
   older than the stale limit).
3. Otherwise the work is under way: how many of the job's items wait in the lanes, behind how much
   queued work in all, and how many are on the consumers now.
"""

from __future__ import annotations

from processor.core.ledger_keys import job_key
from processor.ops.contracts import consumers_of
from processor.ops.status import DEFAULT_STALE_S, StatusView, live_instances


def why_missing(view: StatusView, job: str, model: str, stale_s: float = DEFAULT_STALE_S) -> list[str]:
    """Lines saying why ``job``'s items have no result yet; empty when nothing explains it."""
    if not consumers_of(model, view.contracts):
        return [
            f"no consumer serves model {model!r}: the job's items wait until one announces it "
            "('tokenfabric status' lists them as UNSERVED)"
        ]
    if not live_instances(view, stale_s):
        if not view.checkpoints:
            return [
                "no processor has run on this pipeline: nothing is dispatched until "
                "'tokenfabric processor' runs"
            ]
        return [
            f"no live processor (none checkpointed in the last {stale_s:.0f} s): nothing is dispatched "
            "until one runs again"
        ]
    waiting = view.held(job_key("queued_items", job))
    in_flight = view.held(job_key("in_flight_items", job))
    lines = []
    if waiting:
        lines.append(
            f"{waiting:,} of the job's items wait in the lanes, behind {view.held('queued_tokens'):,} "
            "queued tokens in all"
        )
    if in_flight:
        lines.append(f"{in_flight:,} of the job's items are on the consumers now")
    return lines
