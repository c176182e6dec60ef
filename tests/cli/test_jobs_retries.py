"""``tokenfabric jobs NAME``'s ``retries`` line (processor/cli/jobs.py): the ledger's retried items of
the job, summed over the processors' checkpoints, and the ``max_attempts`` its record names."""

from __future__ import annotations

from processor.cli.jobs import _Costs
from processor.core.accounting import Ledger
from processor.core.shares import JobPolicy
from processor.ops.status import StatusView
from processor.wire.job_share import JobShareRecord
from processor.wire.records import LedgerSnapshotRecord


def view_with(counters: dict[str, int]) -> StatusView:
    view = StatusView()
    for name in ("a", "b"):
        view.checkpoints[name] = LedgerSnapshotRecord(
            instance=name, taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer={}
        )
    return view


def test_the_retries_line_counts_the_ledgers_retried_items_and_names_max_attempts() -> None:
    ledger = Ledger()
    ledger.job_received("nightly", 3, 300)
    ledger.job_routed("nightly", 3, 300, 384)
    ledger.job_retried("nightly", 2, 200)
    view = view_with(ledger.snapshot())
    records = {"nightly": JobShareRecord("nightly", JobPolicy(), 0, max_attempts=5)}
    assert _Costs(records, view).retries("nightly") == (
        "4 items sent back to the lanes after a retriable failure; max_attempts 5"
    )
    assert _Costs({}, view).retries("other") == (
        "0 items sent back to the lanes after a retriable failure; max_attempts 3"
    )
