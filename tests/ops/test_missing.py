"""``why_missing``: the first reason that applies, read from what status reads."""

from __future__ import annotations

from processor.core.contract import Contract
from processor.core.ledger_keys import job_key
from processor.ops.missing import why_missing
from processor.ops.status import StatusView
from processor.wire.records import LedgerSnapshotRecord

NOW = 1_700_000_000_000
CARD = Contract("card", "m", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=2)


def _view(contracts: dict[str, Contract], checkpoint_age_ms: int | None, **counters: int) -> StatusView:
    view = StatusView(contracts=contracts, read_ms=NOW)
    if checkpoint_age_ms is not None:
        view.checkpoints["p0"] = LedgerSnapshotRecord(
            instance="p0",
            taken_ms=NOW - checkpoint_age_ms,
            sequence=1,
            counters=counters,
            per_model={},
            per_consumer={},
        )
    return view


def test_no_consumer_of_the_model_comes_first() -> None:
    (line,) = why_missing(_view({"other": Contract("other", "x", 64, 1, 8, 1)}, None), "j", "m")
    assert line.startswith("no consumer serves model 'm': the job's items wait until one announces it")


def test_then_a_missing_or_stale_processor() -> None:
    assert why_missing(_view({"card": CARD}, None), "j", "m") == [
        "no processor has run on this pipeline: nothing is dispatched until 'tokenfabric processor' runs"
    ]
    (stale,) = why_missing(_view({"card": CARD}, 31_000), "j", "m")
    assert stale.startswith("no live processor (none checkpointed in the last 30 s)")


def test_then_where_the_job_s_items_are() -> None:
    counters = {job_key("queued_items", "j"): 40, "queued_tokens": 9_000, job_key("in_flight_items", "j"): 8}
    assert why_missing(_view({"card": CARD}, 1_000, **counters), "j", "m") == [
        "40 of the job's items wait in the lanes, behind 9,000 queued tokens in all",
        "8 of the job's items are on the consumers now",
    ]
    assert why_missing(_view({"card": CARD}, 1_000), "j", "m") == []
