"""The status view (processor/ops/status.py) over several instances' checkpoints."""

from __future__ import annotations


def test_status_counts_adopted_state_once_while_the_old_owner_is_down() -> None:
    """a crashed holding 10 waiting items; b adopted them. Until a restarts and releases, both
    checkpoints claim the 10; the view (and the audit) must count them once."""
    from processor.cli.status import render
    from processor.ops.status import StatusView
    from processor.wire.records import LedgerSnapshotRecord

    def checkpoint(name: str, counters: dict[str, int], slots: int) -> LedgerSnapshotRecord:
        per_consumer = {"c": {"slots": slots, "in_flight_batches": 0}}
        return LedgerSnapshotRecord(
            instance=name, taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer=per_consumer
        )

    view = StatusView()
    view.checkpoints["a"] = checkpoint("a", {"queued_items": 10, "queued_tokens": 500}, 1)
    view.checkpoints["b"] = checkpoint(
        "b",
        {"queued_items": 12, "queued_tokens": 600, "adopted_queued_items": 10, "adopted_queued_tokens": 500},
        1,
    )
    assert (view.held("queued_items"), view.held("queued_tokens")) == (12, 600)
    view.checkpoints["a"] = checkpoint(
        "a", {"queued_items": 0, "released_queued_items": 10, "released_queued_tokens": 500}, 1
    )
    assert view.held("queued_items") == 12
    render(view)  # renders with several instances without raising


def test_status_shows_each_jobs_share_and_tokens() -> None:
    """The jobs table (docs/shares.md): weight, quota and cap state, tokens per stage, summed over
    instances; no table when no checkpoint counts a job."""
    import io

    from rich.console import Console

    from processor.cli.status import jobs_table, render
    from processor.core.accounting import Ledger
    from processor.ops.status import StatusView
    from processor.wire.records import LedgerSnapshotRecord

    assert jobs_table(StatusView()) == []
    ledger = Ledger()
    ledger.job_received("nightly", 3, 300)
    ledger.job_routed("nightly", 2, 200, 256)
    counters = {
        **ledger.snapshot(),
        "job:weight_milli:nightly": 4000,
        "job:max_tokens_per_s:nightly": 5000,
        "job:max_tokens:nightly": -1,
        "job:capped:nightly": 1,
    }
    view = StatusView()
    for name in ("a", "b"):
        view.checkpoints[name] = LedgerSnapshotRecord(
            instance=name, taken_ms=0, sequence=1, counters=counters, per_model={}, per_consumer={}
        )
    assert view.jobs() == ["nightly"]
    assert view.job_total("nightly", "routed_tokens") == 400
    assert view.job_policy("nightly") == (4.0, 5000, -1, True)
    out = io.StringIO()
    Console(file=out, width=200).print(render(view))
    row = next(line for line in out.getvalue().splitlines() if "nightly" in line)
    assert "5,000/s CAPPED" in row and "400" in row and "600" in row
