"""Unserved adapters in ``status`` and in ``submit``'s warning (processor/ops/status.py,
processor/ops/contracts.py), from checkpoints built here: no broker.

An adapter's work is keyed ``model@adapter`` (processor/core/serving.py), in the ledger's model books
too, so a consumer of the base model, or of another adapter, does not serve it.
"""

from __future__ import annotations

from processor.cli.status import render_text
from processor.core.contract import Contract
from processor.core.serving import serving_key
from processor.kafka.topics import TopicNames
from processor.ops.contracts import consumers_of, unserved_keys, unserved_names
from processor.ops.status import GroupFacts, StatusView, report
from processor.wire.records import LedgerSnapshotRecord

NOW = 1_800_000_000_000
MODEL = "llama-3-8b"
FRENCH = serving_key(MODEL, "french")
TONE = serving_key(MODEL, "support-tone")
CONTRACTS = {
    "card-base": Contract("card-base", MODEL, budget_tokens=4096, max_items=16),
    "card-tone": Contract("card-tone", TONE, budget_tokens=4096, max_items=16),
}


def view_with_waiting(counters: dict[str, int], contracts: dict[str, Contract]) -> StatusView:
    """A live instance whose ledger holds ``counters``; every consumer of ``contracts`` up."""
    view = StatusView(read_ms=NOW, ingest_lag=0, ingest_end=10)
    per_consumer = {
        name: {"slots": 2, "in_flight_batches": 0, "last_completion_ms": NOW - 400} for name in contracts
    }
    view.checkpoints["p0"] = LedgerSnapshotRecord(
        instance="p0",
        taken_ms=NOW - 300,
        sequence=1,
        counters={"owned_partitions": 1, "ingest_partitions": 1, **counters},
        per_model={},
        per_consumer=per_consumer,
    )
    view.contracts.update(contracts)
    view.announced_ms = dict.fromkeys(contracts, NOW - 60_000)
    view.groups = {name: GroupFacts(1, committed=1, end=1, unread=0) for name in contracts}
    return view


def test_an_adapter_no_consumer_serves_is_unserved_by_its_serving_key_beside_served_keys() -> None:
    counters = {
        "queued_items": 45, "queued_tokens": 2_250,
        f"queued_items@{FRENCH}": 40, f"queued_tokens@{FRENCH}": 2_000,
        f"queued_items@{TONE}": 5, f"queued_tokens@{TONE}": 250,
    }  # fmt: skip
    rep = report(view_with_waiting(counters, CONTRACTS), TopicNames(), stale_s=30)
    assert [(u.model, u.items, u.tokens, u.consumers) for u in rep.unserved] == [(FRENCH, 40, 2_000, [])]
    text = render_text(rep)
    row = next(line for line in text.splitlines() if FRENCH in line)
    assert row.split() == [FRENCH, "40", "items", "2,000", "tokens", "(no", "contract)"]


def test_an_adapters_consumer_that_is_down_is_named_for_its_key_only() -> None:
    french = Contract("card-fr", FRENCH, budget_tokens=4096, max_items=16)
    view = view_with_waiting({f"queued_items@{FRENCH}": 3, f"queued_tokens@{FRENCH}": 90}, CONTRACTS)
    view.contracts["card-fr"] = french
    view.groups["card-fr"] = GroupFacts(members=0)
    rep = report(view, TopicNames(), stale_s=30)
    assert [(u.model, u.consumers) for u in rep.unserved] == [(FRENCH, ["card-fr"])]


def test_consumers_of_and_unserved_keys_compare_serving_keys() -> None:
    assert consumers_of(MODEL, CONTRACTS) == ["card-base"]
    assert consumers_of(TONE, CONTRACTS) == ["card-tone"]
    assert consumers_of(FRENCH, CONTRACTS) == []
    assert unserved_keys(MODEL, ["", "support-tone", "french", "french"], CONTRACTS) == [FRENCH]
    assert unserved_keys(MODEL, ["support-tone"], {"card-base": CONTRACTS["card-base"]}) == [TONE]
    assert unserved_keys("other", [""], CONTRACTS) == ["other"]


def test_unserved_keys_read_as_words_for_submits_warning() -> None:
    assert unserved_names(["labeller"]) == "model 'labeller'"  # the base model: as the warning always read
    assert unserved_names([MODEL, FRENCH]) == f"model {MODEL!r}, adapter 'french' of model {MODEL!r}"
