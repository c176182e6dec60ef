"""Completion and CompletionBatch messages (processor/wire/completions.py): round trips, either form
read as completions, refusals, and a batch too large for one message split in item order."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.wire.completions import (
    decode_completion,
    decode_completion_batch,
    decode_completions,
    encode_completion,
    encode_completion_batch,
    encode_completion_batches,
)
from processor.wire.control import decode_any
from processor.wire.errors import DecodeError
from processor.wire.items import encode_token_item
from processor.wire.records import CompletionBatchRecord, CompletionRecord
from processor.wire.schemas import schema_of
from tests.wire.helpers import (
    batch_of,
    completion_batch_dict,
    completion_batches,
    completion_rec,
    fastavro_message,
    item,
    reason_of,
)


@pytest.mark.parametrize(
    "rec",
    [
        completion_rec(),
        completion_rec(status="failed", reason="engine OOM", output=b"", output_tokens=0, cache_hit=False),
        completion_rec(status="rejected", reason="oversized", batch_id="", consumer="", padded_tokens=0),
    ],
)
def test_completion_round_trip(rec: CompletionRecord) -> None:
    value = encode_completion(rec)
    assert schema_of(value) == "Completion"
    assert decode_completion(value) == rec
    assert decode_any(value) == rec


def test_completion_refuses_unknown_status_and_int_overflow() -> None:
    with pytest.raises(ValueError, match="status"):
        encode_completion(completion_rec(status="maybe"))
    with pytest.raises(ValueError, match="input_tokens"):
        encode_completion(completion_rec(input_tokens=1 << 31))


BATCH_COMPLETIONS = [
    completion_rec(),
    completion_rec(
        item_id="item-2", job_id="", status="failed", reason="engine OOM", output=b"", cache_hit=False
    ),
    completion_rec(item_id="item-3", status="rejected", reason="contract: too long", output_tokens=0),
]


@pytest.mark.parametrize("records", [BATCH_COMPLETIONS, BATCH_COMPLETIONS[:1]], ids=["three", "one"])
def test_completion_batch_round_trip(records: list[CompletionRecord]) -> None:
    rec = batch_of(*records)
    assert [o.item_id for o in rec.items] == [r.item_id for r in records]
    value = encode_completion_batch(rec)
    assert schema_of(value) == "CompletionBatch"
    assert value == fastavro_message("CompletionBatch", completion_batch_dict(rec))
    assert decode_completion_batch(value) == rec
    assert decode_any(value) == rec
    assert decode_completions(value) == records
    assert rec.completions() == records


def test_an_empty_completion_batch_round_trips() -> None:
    rec = CompletionBatchRecord(batch_id="b", consumer="c", model="m", completed_ms=1, items=[])
    assert decode_completions(encode_completion_batch(rec)) == []


def test_decode_completions_reads_either_form_and_refuses_the_rest() -> None:
    single = completion_rec()
    assert decode_completions(encode_completion(single)) == [single]
    assert decode_completions(encode_completion_batch(batch_of(single))) == [single]
    assert reason_of(decode_completions, encode_token_item(item())) == "unknown-schema"
    assert reason_of(decode_completions, b"{}") == "bad-magic"
    assert reason_of(decode_completions, None) == "bad-magic"
    value = encode_completion_batch(batch_of(*BATCH_COMPLETIONS))
    assert reason_of(decode_completions, value[:-1]) == "avro-decode"
    assert reason_of(decode_completions, value + b"\x00") == "trailing-bytes"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"status": "maybe"}, "status 'maybe'"),
        ({"input_tokens": 1 << 31}, "input_tokens"),
        ({"output_tokens": -(1 << 31) - 1}, "output_tokens"),
        ({"queued_ms": 1 << 63}, "queued_ms"),
    ],
)
def test_completion_batch_refuses_unknown_status_and_int_overflow(
    changes: dict[str, Any], match: str
) -> None:
    rec = batch_of(*BATCH_COMPLETIONS)
    items = [dataclasses.replace(rec.items[0], **changes), *rec.items[1:]]
    with pytest.raises(ValueError, match=match):
        encode_completion_batch(dataclasses.replace(rec, items=items))
    with pytest.raises(ValueError, match="padded_tokens"):
        encode_completion_batch(dataclasses.replace(rec, padded_tokens=1 << 31))
    with pytest.raises(ValueError, match="completed_ms"):
        encode_completion_batch(dataclasses.replace(rec, completed_ms=-(1 << 63) - 1))


def test_decode_completion_batch_refuses_an_item_int_out_of_range() -> None:
    d = completion_batch_dict(batch_of(completion_rec()))
    d["items"][0]["input_tokens"] = 1 << 40  # fastavro writes any int as a varint
    value = fastavro_message("CompletionBatch", d)
    with pytest.raises(DecodeError, match=r"ItemOutcome\.input_tokens") as info:
        decode_completions(value)
    assert info.value.reason == "avro-decode"


def split_sizes(rec: CompletionBatchRecord, max_bytes: int) -> list[bytes]:
    """The split messages, each checked: under the limit (or one item alone), same batch fields, and
    as full as the limit allows (the next message's first item would not have fitted)."""
    messages = encode_completion_batches(rec, max_bytes)
    parts = [decode_completion_batch(value) for value in messages]
    for value, part, after in zip(messages, parts, [*parts[1:], None], strict=True):
        assert len(value) <= max_bytes or len(part.items) <= 1, (len(value), max_bytes)
        assert dataclasses.replace(part, items=[]) == dataclasses.replace(rec, items=[])
        if after is not None:
            fuller = dataclasses.replace(part, items=[*part.items, after.items[0]])
            assert len(encode_completion_batch(fuller)) > max_bytes
    assert [c for value in messages for c in decode_completions(value)] == rec.completions()
    return messages


def test_a_batch_too_large_for_one_message_is_split_in_item_order() -> None:
    outputs = [bytes([n]) * size for n, size in enumerate([400, 300, 300, 920, 10, 10, 500])]
    records = [completion_rec(item_id=f"item-{n}", output=out) for n, out in enumerate(outputs)]
    rec = batch_of(*records)
    whole = encode_completion_batch(rec)
    assert encode_completion_batches(rec, len(whole)) == [whole]  # fits: one message, the same bytes
    messages = split_sizes(rec, 1000)
    # in order, as full as fits: 400+300 | 300 | 920 | 10+10+500 (an item is its output and ~25 bytes)
    assert [len(decode_completion_batch(v).items) for v in messages] == [2, 1, 1, 3]
    alone = split_sizes(rec, 600)  # the 920-byte output cannot fit: it travels alone, over the limit
    assert any(len(v) > 600 for v in alone)
    assert len(split_sizes(rec, 1)) == len(records)  # a limit below any item: one message per item


@given(completion_batches)
def test_valid_completion_batches_round_trip_and_match_fastavros_bytes(rec: CompletionBatchRecord) -> None:
    value = encode_completion_batch(rec)
    assert value == fastavro_message("CompletionBatch", completion_batch_dict(rec))
    assert decode_completion_batch(value) == rec
    assert decode_completions(value) == rec.completions()


@given(completion_batches, st.integers(1, 400))
def test_any_split_keeps_every_item_once_in_order(rec: CompletionBatchRecord, max_bytes: int) -> None:
    split_sizes(rec, max_bytes)
