"""The ``cancelled`` and ``expired`` completion statuses, and the JobShare record's lifecycle fields:
written and read by every decoder, and the messages of the schemas before them still read.

(processor/wire/completions.py, processor/wire/heads.py, processor/wire/job_share.py)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.core.shares import JobPolicy
from processor.wire.completion_heads import (
    decode_completion_head,
    decode_completion_head_strict,
    decode_completions_head,
)
from processor.wire.completions import (
    PRE_ENDINGS_COMPLETION,
    PRE_ENDINGS_COMPLETION_BATCH,
    PRE_ENDINGS_STATUSES,
    PRE_RETRY_COMPLETION,
    PREVIOUS_COMPLETION,
    decode_completion,
    decode_completion_batch,
    decode_completions,
    encode_completion,
    encode_completion_batch,
)
from processor.wire.errors import DecodeError
from processor.wire.job_share import (
    PREVIOUS_JOB_SHARE_HEADER,
    JobShareRecord,
    decode_job_share_record,
    encode_job_share_record,
    encode_previous_job_share,
)
from processor.wire.records import STATUSES, CompletionBatchRecord, CompletionRecord, ItemOutcomeRecord
from processor.wire.schemas import rabin_fingerprint

ROOT = Path(__file__).resolve().parents[2]


def completion(status: str, item_id: str = "a") -> CompletionRecord:
    return CompletionRecord(
        item_id=item_id,
        job_id="nightly",
        model="m",
        status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else f"{status}: why",
        input_tokens=7,
        completed_ms=1_700_000_000_000,
    )


def test_the_statuses_are_the_schemas_symbols_with_the_endings_appended() -> None:
    for name in ("Completion", "CompletionBatch"):
        text = (ROOT / "schemas" / f"{name}.avsc").read_text(encoding="utf-8")
        assert '"symbols": ["ok", "failed", "rejected", "cancelled", "expired"]' in text
    assert STATUSES == ("ok", "failed", "rejected", "cancelled", "expired")
    assert PRE_ENDINGS_STATUSES == ("ok", "failed", "rejected")


@pytest.mark.parametrize("status", ["cancelled", "expired"])
def test_an_ending_round_trips_in_both_forms_and_every_head_reads_it_as_not_ok(status: str) -> None:
    one = completion(status)
    value = encode_completion(one)
    assert decode_completion(value) == one
    assert (
        decode_completion_head(value)
        == decode_completion_head_strict(value)
        == ("a", "", "", False, False, 0, False)
    )
    rec = CompletionBatchRecord(
        batch_id="",
        consumer="",
        model="m",
        completed_ms=5,
        items=[ItemOutcomeRecord(item_id=i, status=status, input_tokens=3, reason="r") for i in "xyz"],  # type: ignore[arg-type]
    )
    value = encode_completion_batch(rec)
    assert decode_completion_batch(value) == rec
    assert [c.status for c in decode_completions(value)] == [status] * 3
    head = decode_completions_head(value)
    assert (head.batch_id, head.items) == ("", [(i, False, False) for i in "xyz"])


@pytest.mark.parametrize("status", PRE_ENDINGS_STATUSES)
def test_messages_written_before_the_endings_read_as_they_did(status: str) -> None:
    """What a consumer app not yet upgraded writes: the same bytes as the schema after the endings
    and before retries (``PRE_RETRY``) under the previous fingerprint."""
    rec = completion(status)
    fields = {n: getattr(rec, n) for n in CompletionRecord.__dataclass_fields__}
    old = PRE_ENDINGS_COMPLETION.encode(fields)
    assert old[10:] == PRE_RETRY_COMPLETION.encode(fields)[10:]
    assert old[:10] not in (encode_completion(rec)[:10], PRE_RETRY_COMPLETION.header)
    assert decode_completions(old) == [rec]
    assert decode_completion_head(old) == decode_completion_head_strict(old)
    outcome = ItemOutcomeRecord(item_id="x", status=rec.status, input_tokens=3, cached_tokens=2)
    batch = CompletionBatchRecord(batch_id="b-1", consumer="c", model="m", completed_ms=5, items=[outcome])
    batch_fields = {
        n: getattr(batch, n)
        for n in ("batch_id", "consumer", "model", "padded_tokens", "engine_ms", "completed_ms")
    }
    old_batch = PRE_ENDINGS_COMPLETION_BATCH.encode(
        {**batch_fields, "items": [{n: getattr(outcome, n) for n in outcome.__dataclass_fields__}]}
    )
    assert decode_completion_batch(old_batch) == batch
    assert decode_completions_head(old_batch).cached_tokens == [2]


def test_the_earlier_headers_are_the_fingerprints_of_the_schemas_as_they_were() -> None:
    """The header before ``cached_tokens`` is the one golden/previous.json documents, and the header
    before the endings is the fingerprint of the schema as committed before them."""
    previous = json.loads((ROOT / "schemas" / "golden" / "previous.json").read_text(encoding="utf-8"))
    documented = {r["record"]: r["header_hex"] for r in previous["records"]}
    assert PREVIOUS_COMPLETION.header.hex() == documented["Completion"]
    three = json.loads((ROOT / "schemas" / "Completion.avsc").read_text(encoding="utf-8"))
    three["fields"] = [f for f in three["fields"] if f["name"] not in ("attempt", "retriable")]
    for field in three["fields"]:
        if field["name"] == "status":
            field["type"]["symbols"] = ["ok", "failed", "rejected"]
    fingerprint = rabin_fingerprint(to_parsing_canonical_form(parse_schema(three)).encode())
    assert PRE_ENDINGS_COMPLETION.header[2:] == fingerprint.to_bytes(8, "little")


def test_a_job_share_carries_its_lifecycle_and_a_previous_record_reads_with_none() -> None:
    rec = JobShareRecord("nightly", JobPolicy(weight=2.0, max_tokens=100), 5, cancelled_ms=7, deadline_ms=9)
    assert decode_job_share_record(encode_job_share_record(rec)) == rec
    old = encode_previous_job_share(rec)
    assert old[:10] == PREVIOUS_JOB_SHARE_HEADER
    assert decode_job_share_record(old) == JobShareRecord("nightly", rec.policy, 5)
    with pytest.raises(DecodeError) as info:
        decode_job_share_record(b"\xc3\x01" + bytes(8) + b"x")
    assert info.value.reason == "unknown-schema"


def test_the_earlier_headers_are_the_ones_already_on_the_topics() -> None:
    """Records already on a pipeline's topics were written with the schemas before this change: their
    headers (the fingerprints of the schemas as committed before it) are the ones read as earlier."""
    assert PREVIOUS_JOB_SHARE_HEADER.hex() == "c301c7cd391237687ad4"
    assert PRE_ENDINGS_COMPLETION.header.hex() == "c3016628276cdd4bc0b0"
    assert PRE_ENDINGS_COMPLETION_BATCH.header.hex() == "c30118bbf53ccb840a1e"
