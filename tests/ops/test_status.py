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
