"""The checkpoint keys' grammar (processor/core/ledger_keys.py): what the ledger writes, status, the
audit and a restore read back, with owners that hold the separators."""

from __future__ import annotations

import pytest

from processor.core.accounting import Ledger
from processor.core.ledger_keys import CounterKey, consumer_key, job_key, model_key, parse_key, stage_unit
from tests.core.test_accounting import busy_ledger


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("received_items", CounterKey("received_items")),
        ("owned_partitions", CounterKey("owned_partitions")),
        ("queued_tokens@llama-3-8b", CounterKey("queued_tokens", "model", "llama-3-8b")),
        ("queued_tokens@org@model#v2", CounterKey("queued_tokens", "model", "org@model#v2")),
        ("padded_tokens#gpu-0", CounterKey("padded_tokens", "consumer", "gpu-0")),
        ("job:routed_tokens:nightly", CounterKey("routed_tokens", "job", "nightly")),
        ("job:weight_milli:", CounterKey("weight_milli", "job", "")),
    ],
)
def test_each_scope_parses_and_encodes_back(key: str, parsed: CounterKey) -> None:
    assert parse_key(key) == parsed
    assert parsed.encode() == key


def test_the_encoders_write_the_grammar() -> None:
    assert model_key("queued_items", "m#1") == "queued_items@m#1"
    assert consumer_key("batches", "gpu-0") == "batches#gpu-0"
    assert job_key("capped", "nightly") == "job:capped:nightly"
    assert parse_key("queued_items@m").renamed("adopted_queued_items").encode() == "adopted_queued_items@m"


def test_a_job_key_without_its_job_is_refused() -> None:
    with pytest.raises(ValueError, match="job:<counter>:<job>"):
        parse_key("job:routed_tokens")


def test_stage_unit_splits_a_stages_items_or_tokens_only() -> None:
    assert stage_unit("in_flight_tokens") == ("in_flight", "tokens")
    assert stage_unit("received_items") == ("received", "items")
    assert stage_unit("batches") is None
    assert stage_unit("max_tokens_per_s") is None


def test_every_key_a_ledger_writes_is_in_the_grammar_and_restores() -> None:
    ledger = busy_ledger()
    ledger.received("org@model#v2", 10)
    ledger.job_received("nightly", 1, 10)
    snap = ledger.snapshot()
    scopes = {parse_key(k).scope for k in snap}
    assert scopes == {"total", "model", "consumer", "job"}
    assert all(parse_key(k).encode() == k for k in snap)
    assert Ledger.restore(snap).snapshot() == snap


def test_a_restore_keeps_a_jobs_book_but_not_its_share_gauges() -> None:
    """The service checkpoints each job's share policy beside the ledger (``job:weight_milli:<job>``):
    a restore makes the job known and leaves its books at zero."""
    restored = Ledger.restore(
        {job_key("weight_milli", "nightly"): 2500, job_key("max_tokens", "nightly"): -1}
    )
    assert list(restored.jobs) == ["nightly"]
    assert restored.jobs["nightly"].received.tokens == 0
