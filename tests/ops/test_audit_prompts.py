"""The audit's comparison of cached and computed prompt tokens with the checkpoints (no broker): made
only when every checkpoint counts prompts, and a difference when they disagree with the topics."""

from __future__ import annotations

from processor.ops.audit import AuditReport, _compare
from processor.ops.status import StatusView
from processor.wire.records import LedgerSnapshotRecord

NOW = 1_800_000_000_000


def _view(*counters: dict[str, int]) -> StatusView:
    view = StatusView(read_ms=NOW)
    for n, c in enumerate(counters):
        view.checkpoints[f"p{n}"] = LedgerSnapshotRecord(
            instance=f"p{n}", taken_ms=NOW, sequence=1, counters=c, per_model={}, per_consumer={}
        )
    return view


def _derived() -> AuditReport:
    """What the topics said: 4 items, 400 prompt tokens, 300 of them served from the cache."""
    return AuditReport(
        received_items=4, received_tokens=400, dispatched_items=4, dispatched_tokens=400,
        completed_items=4, completed_tokens=400, cached_prompt_tokens=300, prefill_tokens=100,
    )  # fmt: skip


def _claimed(cached: int, prefill: int, items: int = 4) -> dict[str, int]:
    """One instance's checkpoint: ``items`` items of 100 tokens received, routed and completed."""
    tokens = 100 * items
    return {
        "received_items": items, "received_tokens": tokens, "routed_items": items,
        "routed_tokens": tokens, "completed_items": items, "completed_tokens": tokens,
        "cached_prompt_tokens": cached, "prefill_tokens": prefill,
    }  # fmt: skip


def test_prompt_counts_that_match_the_topics_are_clean() -> None:
    r = _derived()
    _compare(r, _view(_claimed(300, 100)))
    assert r.prompts_compared and r.clean, r.differences


def test_prompt_counts_that_differ_from_the_topics_are_a_difference() -> None:
    r = _derived()
    _compare(r, _view(_claimed(250, 150)))
    assert r.differences == [
        "cached_prompt_tokens: checkpoint says 250, topics say 300",
        "prefill_tokens: checkpoint says 150, topics say 100",
    ]
    assert not r.clean


def test_checkpoints_without_prompt_counters_are_not_compared() -> None:
    r = _derived()
    old = {k: v for k, v in _claimed(0, 0, items=2).items() if "prompt" not in k and "prefill" not in k}
    _compare(r, _view(_claimed(150, 50, items=2), old))
    assert not r.prompts_compared and r.clean, r.differences
    assert "no checkpoint counts them" in "\n".join(r.lines())
