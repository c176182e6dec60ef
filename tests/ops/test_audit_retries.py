"""The audit's reading of retries (processor/ops/audit.py): a failed, retriable completion that a
later completion of the item from another batch follows is a retry, not a duplicate, and the item's
result is its last completion."""

from __future__ import annotations

from processor.ops.audit import AuditReport, _last_completions
from processor.wire.records import CompletionRecord


def done(item: str, batch: str, status: str, attempt: int = 1, retriable: bool = False) -> CompletionRecord:
    return CompletionRecord(
        item_id=item,
        batch_id=batch,
        model="m",
        status=status,  # type: ignore[arg-type]
        input_tokens=10,
        completed_ms=1,
        attempt=attempt,
        retriable=retriable,
    )


def test_retries_are_counted_apart_from_duplicates_and_the_last_attempt_is_the_result() -> None:
    r = AuditReport()
    read = [
        done("a", "b-2", "ok", attempt=3),  # read first (another results partition): still the last
        done("a", "b-1", "failed", attempt=1, retriable=True),
        done("a", "b-3", "failed", attempt=2, retriable=True),
        done("b", "b-1", "failed", retriable=False),
        done("b", "b-4", "ok"),  # after a failure not worth a retry: a duplicate
        done("c", "b-1", "ok"),
        done("c", "b-1", "ok"),  # the same completion twice: a duplicate
        done("d", "b-1", "failed", attempt=3, retriable=True),  # its attempts spent: final
        done("e", "b-5", "ok"),  # a consumer that writes no attempts: read before the failure it
        done("e", "b-1", "failed", retriable=True),  # followed (another results partition)
    ]
    results = {c.item_id: c for c in _last_completions(r, read)}
    assert {i: (c.status, c.batch_id) for i, c in results.items()} == {
        "a": ("ok", "b-2"),
        "b": ("failed", "b-1"),
        "c": ("ok", "b-1"),
        "d": ("failed", "b-1"),
        "e": ("ok", "b-5"),
    }
    assert (r.retried_items, r.retried_tokens, r.duplicate_completions) == (3, 30, 2)
