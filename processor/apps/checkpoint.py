"""The processor's checkpoint record: the ledger plus the gauges ``status`` shows beside it.

Written with every commit (processor/state/durability.py), so what ``status`` and a restart read always
matches the committed state. Kept apart from the service loop: it only reads the core.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from processor.core.ledger_keys import job_key
from processor.core.scheduler import Scheduler
from processor.core.view import SchedulerView
from processor.wire.records import LedgerSnapshotRecord


def checkpoint_record(
    core: Scheduler,
    instance: str,
    sequence: int,
    extra: Mapping[str, int],
    last_completion_ms: Mapping[str, int],
) -> LedgerSnapshotRecord:
    """The ledger's counters, the lanes' gauges, ``extra`` (the service's own gauges) and each
    consumer's contract, slots and in-flight batches, as one record."""
    view = core.view
    waiting, lanes = view.waiting(), view.lanes()
    counters = view.ledger_snapshot()
    counters.update(
        {
            "waiting_items": waiting.items,
            "waiting_tokens": waiting.tokens,
            "lanes_in_use": lanes.lanes_in_use,
            "lanes_in_use_peak": lanes.lanes_in_use_peak,
            "lane_budget": lanes.lane_budget,
            "shapes": lanes.shapes,
            "lane_reuses": lanes.reuses,
            "new_lanes": lanes.new_lanes,
            "idle_reclaims": lanes.idle_reclaims,
            "shape_switches": view.shape_switches(),
            "oversized": view.oversized(),
            **extra,
        }
    )
    per_consumer: dict[str, dict[str, int]] = {}
    for name, consumer in view.consumers().items():
        c = consumer.contract
        per_consumer[name] = {
            "in_flight_batches": consumer.in_flight,
            "max_inflight": c.max_inflight,
            "slots": consumer.slots,
            "budget_tokens": c.budget_tokens,
            "max_items": c.max_items,
            "pad_multiple": c.pad_multiple,
            "shape_switches": consumer.shape_switches,
            "last_completion_ms": last_completion_ms.get(name, 0),
        }
    return LedgerSnapshotRecord(
        instance=instance,
        taken_ms=int(time.time() * 1000),
        sequence=sequence,
        counters=counters,
        per_model={},
        per_consumer=per_consumer,
    )


def share_counters(view: SchedulerView, now_ms: int) -> dict[str, int]:
    """Per job, for status and metrics: the weight (in thousandths), the quotas (-1: none) and
    whether a quota holds the job back now."""
    out: dict[str, int] = {}
    for job in view.share_jobs():
        p = view.policy(job)
        out[job_key("weight_milli", job)] = round(p.weight * 1000)
        out[job_key("max_tokens_per_s", job)] = -1 if p.max_tokens_per_s is None else int(p.max_tokens_per_s)
        out[job_key("max_tokens", job)] = -1 if p.max_tokens is None else p.max_tokens
        out[job_key("capped", job)] = int(p.capped and view.capped_now(job, now_ms))
    return out
