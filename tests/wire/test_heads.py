"""The processor's fast path must accept exactly what the full codec accepts, refuse it for the same
reason, and produce byte-identical batches: it is a shortcut, not a second format."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.item import Batch, Item
from processor.core.serving import SEPARATOR, serving_key
from processor.wire.completion_heads import (
    decode_completion_head,
    decode_completion_head_strict,
    decode_completions_head,
)
from processor.wire.completions import (
    PREVIOUS_COMPLETION,
    PREVIOUS_COMPLETION_BATCH,
    decode_completion,
    decode_completions,
    encode_completion,
    encode_completion_batch,
)
from processor.wire.heads import _usual_head, decode_batch_head, decode_item_head
from processor.wire.items import decode_batch, decode_token_item, encode_batch, encode_token_item
from processor.wire.records import (
    BatchRecord,
    CompletionBatchRecord,
    CompletionRecord,
    Status,
    TokenItemRecord,
    tokens_from_ids,
)
from processor.wire.schemas import HEADER_SIZE, HEADERS
from tests.wire.helpers import (
    U64,
    batch_message,
    completion_batches,
    completions,
    damage,
    generation_requests,
    item,
    item_dict,
    make_batch,
    mutated_items,
    outcome,
    token_items,
)


def same_as_full(head: Any, rec: TokenItemRecord, value: bytes) -> bool:
    """Every field the head keeps, the job (docs/shares.md) included, equal to the full record's;
    the head's model is the item's serving key (its model and its request's adapter)."""
    adapter = "" if rec.request is None else rec.request.adapter
    return (
        head.item_id, head.model, head.shape, head.token_count, head.output_budget, head.message, head.job
    ) == (
        rec.item_id, serving_key(rec.model, adapter), rec.shape, rec.token_count, rec.output_budget, value,
        rec.job_id,
    )  # fmt: skip


@given(token_items())
def test_the_head_of_a_valid_item_is_the_full_records_fields_and_body(rec: TokenItemRecord) -> None:
    value = encode_token_item(rec)
    assert same_as_full(decode_item_head(value), decode_token_item(value), value)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_items())
def test_damaged_items_are_refused_for_the_same_reason(value: bytes) -> None:
    assert_same_outcome(value)


def assert_same_outcome(
    value: bytes,
    full_decoder: Any = decode_token_item,
    head_decoder: Any = decode_item_head,
    same: Any = lambda head, full, value: same_as_full(head, full, value),
) -> None:
    """The head decoder refuses what the full one refuses, for the same reason, and agrees on the rest."""
    full = outcome(full_decoder, value)
    head = outcome(head_decoder, value)
    if isinstance(full, str):
        assert head == full
    else:
        assert not isinstance(head, str), head
        assert same(head, full, value)


@settings(max_examples=300)
@given(st.binary(max_size=120))
def test_random_bodies_raise_only_decode_error(body: bytes) -> None:
    for header in (
        HEADERS["TokenItem"],
        HEADERS["Completion"],
        HEADERS["CompletionBatch"],
        b"",
    ):
        outcome(decode_item_head, header + body)
        outcome(decode_completion_head, header + body)
        outcome(decode_completion_head_strict, header + body)
        outcome(decode_completions_head, header + body)


@st.composite
def usual_items(draw: st.DrawFn) -> TokenItemRecord:
    """Items as producers usually write them: what ``_usual_head`` reads in one pass."""
    short = st.text(min_size=1, max_size=15)  # up to 60 UTF-8 bytes, under the one-byte length
    ids = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3000))
    return TokenItemRecord(
        item_id=draw(short),
        job_id=draw(st.just("") | short),
        model=draw(short.filter(lambda name: SEPARATOR not in name)),
        shape=draw(st.integers(0, U64)),
        token_count=len(ids),
        tokens=tokens_from_ids(ids),
        shape_components=None,
        produced_ms=draw(st.integers(1 << 34, (1 << 41) - 1)),  # mid-1970 to 2039: six varint bytes
        output_budget=draw(st.none() | st.integers(-8191, 8191)),
        metadata=None,
        request=draw(st.none() | generation_requests()),
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(usual_items())
def test_usual_items_are_read_in_one_pass_to_the_full_records_fields(rec: TokenItemRecord) -> None:
    value = encode_token_item(rec)
    head = _usual_head(value)
    assert head is not None  # the general path would give the same head, only slower
    assert same_as_full(head, decode_token_item(value), value)
    assert outcome(decode_item_head, value + b"\0") == "trailing-bytes"


@st.composite
def damaged_usual_items(draw: st.DrawFn) -> bytes:
    return damage(draw, encode_token_item(draw(usual_items())))


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_usual_items())
def test_damaged_usual_items_are_refused_for_the_same_reason(value: bytes) -> None:
    assert_same_outcome(value)


@given(st.lists(token_items(), min_size=1, max_size=5), st.booleans())
def test_a_batch_of_spliced_messages_is_byte_identical_to_one_of_records(
    records: list[TokenItemRecord], oversized: bool
) -> None:
    def batch(payloads: list[Any]) -> Batch:
        items = [
            Item(r.item_id, r.model, r.shape, r.token_count, 0, p)
            for r, p in zip(records, payloads, strict=True)
        ]
        return Batch("b-1", "card", records[0].model, records[0].shape, 3, 8, 64, items, 1234, oversized)

    messages = [encode_token_item(r) for r in records]
    assert encode_batch(batch(messages)) == encode_batch(batch(records))


def head_of(rec: CompletionRecord) -> tuple[str, str, str, bool, bool, int, bool]:
    """What :func:`decode_completion_head` should say of ``rec``: ``retriable`` only when failed."""
    retriable = rec.retriable and rec.status == "failed"
    return (
        rec.item_id,
        rec.batch_id,
        rec.consumer,
        rec.status == "ok",
        rec.cache_hit,
        rec.cached_tokens,
        retriable,
    )


@given(completions)
def test_the_completion_head_matches_the_full_decoder(rec: CompletionRecord) -> None:
    value = encode_completion(rec)
    expected = head_of(rec)
    assert decode_completion_head(value) == expected
    assert decode_completion_head_strict(value) == expected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(completions, st.data())
def test_a_damaged_completion_is_refused_whenever_the_full_decoder_refuses_it(
    rec: CompletionRecord, data: st.DataObject
) -> None:
    value = bytearray(encode_completion(rec))
    at = data.draw(st.integers(HEADER_SIZE, len(value) - 1))
    value[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del value[data.draw(st.integers(HEADER_SIZE, len(value))) :]
    full = outcome(decode_completion, bytes(value))
    head = outcome(decode_completion_head_strict, bytes(value))
    quick = outcome(decode_completion_head, bytes(value))
    # the quick reader parses only the leading fields: whatever it accepts, it reads as the full one
    if not isinstance(full, str) and quick != "avro-decode":  # avro-decode: where fastavro is lax
        assert quick == head_of(full)
    if isinstance(full, str):
        # fastavro reads over-long varints and negative union indexes the spec forbids; the hand
        # decoder may refuse more (avro-decode), never less
        assert isinstance(head, str), (full, head)
    elif not isinstance(head, str):
        assert head == head_of(full)
    else:
        assert head == "avro-decode"


def heads_of(
    records: list[CompletionRecord],
) -> tuple[str, str, list[tuple[str, bool, bool]], list[int], list[str] | tuple[()]]:
    """What :func:`decode_completions_head` should say of a message holding ``records``."""
    first = records[0] if records else None
    return (
        first.batch_id if first else "",
        first.consumer if first else "",
        [(r.item_id, r.status == "ok", r.cache_hit) for r in records],
        [r.cached_tokens for r in records],
        [r.item_id for r in records if r.retriable and r.status == "failed"] or (),
    )


@given(completions)
def test_the_completions_head_of_one_completion_is_a_list_of_one(rec: CompletionRecord) -> None:
    value = encode_completion(rec)
    assert decode_completions_head(value) == heads_of(decode_completions(value))


@given(completion_batches)
def test_the_completions_head_of_a_batch_matches_the_full_decoder(rec: CompletionBatchRecord) -> None:
    value = encode_completion_batch(rec)
    head = decode_completions_head(value)
    assert head == (
        rec.batch_id,
        rec.consumer,
        [(o.item_id, o.status == "ok", o.cache_hit) for o in rec.items],
        [o.cached_tokens for o in rec.items],
        [o.item_id for o in rec.items if o.retriable and o.status == "failed"] or (),
    )
    if rec.items:
        assert head == heads_of(decode_completions(value))


def _status_then(status: Status) -> Status:
    """``status`` if the enum before ``cancelled`` and ``expired`` had it, else ``failed``."""
    return status if status in ("ok", "failed", "rejected") else "failed"


@given(completions, completion_batches)
def test_messages_written_before_cached_tokens_read_the_same_with_zero_there(
    rec: CompletionRecord, batch: CompletionBatchRecord
) -> None:
    """A consumer not yet upgraded writes the previous schemas: every reader still reads them.
    Its statuses are the symbols the enum had then (the first three: ``cancelled`` and ``expired``
    came later), so the drawn ones are mapped onto those."""
    rec = replace(rec, status=_status_then(rec.status))
    batch = replace(batch, items=[replace(o, status=_status_then(o.status)) for o in batch.items])
    fields_of_rec = {n: getattr(rec, n) for n in CompletionRecord.__dataclass_fields__}
    old = PREVIOUS_COMPLETION.encode(fields_of_rec)
    expected = (rec.item_id, rec.batch_id, rec.consumer, rec.status == "ok", rec.cache_hit, 0, False)
    assert decode_completion_head(old) == decode_completion_head_strict(old) == expected
    defaults = {"cached_tokens": 0, "attempt": 1, "retriable": False}
    assert decode_completions(old) == [CompletionRecord(**{**fields_of_rec, **defaults})]
    fields = {
        n: getattr(batch, n)
        for n in ("batch_id", "consumer", "model", "padded_tokens", "engine_ms", "completed_ms")
    }
    items = [{n: getattr(o, n) for n in o.__dataclass_fields__} for o in batch.items]
    old_batch = PREVIOUS_COMPLETION_BATCH.encode({**fields, "items": items})
    head = decode_completions_head(old_batch)
    assert head.items == [(o.item_id, o.status == "ok", o.cache_hit) for o in batch.items]
    assert head.cached_tokens == [0] * len(batch.items) and head.retriable == ()
    assert [c.cached_tokens for c in decode_completions(old_batch)] == [0] * len(batch.items)
    assert {(c.attempt, c.retriable) for c in decode_completions(old_batch)} <= {(1, False)}


@st.composite
def damaged_completion_batches(draw: st.DrawFn) -> bytes:
    """A valid CompletionBatch (at least one item) with a few bytes changed, cut or added after the header."""
    rec = draw(completion_batches.filter(lambda r: bool(r.items)))
    return damage(draw, encode_completion_batch(rec))


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_completion_batches())
def test_a_damaged_completion_batch_is_refused_whenever_the_full_decoder_refuses_it(value: bytes) -> None:
    """The batch head walks every field, so it refuses what :func:`decode_completions` refuses,
    and what it accepts it reads the same. It may refuse more, with avro-decode, where fastavro is
    laxer than the spec (over-long varints, negative union or enum indexes, boolean bytes over 1)."""
    full = outcome(decode_completions, value)
    head = outcome(decode_completions_head, value)
    if isinstance(full, str):
        assert isinstance(head, str), (full, head)
        assert head in (full, "avro-decode"), (full, head)
    elif isinstance(head, str):
        assert head == "avro-decode", head
    elif full:
        assert head == heads_of(full)
    else:
        assert head.items == []


def same_batch(head: Any, rec: BatchRecord) -> bool:
    fields = ("batch_id", "consumer", "model", "shape", "lane", "padded_length", "pad_multiple", "created_ms")
    return [getattr(head, f) for f in (*fields, "oversized")] == [
        getattr(rec, f) for f in (*fields, "oversized")
    ] and (
        head.items
        == [(r.item_id, r.model, r.shape, r.token_count, r.output_budget, r.request) for r in rec.items]
    )


@st.composite
def batch_messages(draw: st.DrawFn) -> bytes:
    records = draw(st.lists(token_items(), max_size=4))
    return encode_batch(make_batch(records, oversized=draw(st.booleans()), shape=draw(st.integers(0, U64))))


@given(batch_messages())
def test_the_head_of_a_batch_is_the_full_decoders_fields(value: bytes) -> None:
    assert same_batch(decode_batch_head(value), decode_batch(value))


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(batch_messages(), st.data())
def test_a_damaged_batch_is_refused_for_the_same_reason(value: bytes, data: st.DataObject) -> None:
    assert_same_outcome(
        damage(data.draw, value),
        decode_batch,
        decode_batch_head,
        lambda head, full, _v: same_batch(head, full),
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"token_count": 2}, "token-count-mismatch"),
        ({"item_id": ""}, "empty-item-id"),
        ({"model": ""}, "empty-model"),
        ({"token_count": 0, "tokens": b""}, "negative-token-count"),
    ],
)
def test_a_batch_item_breaking_a_rule_is_refused_with_the_rules_reason(
    change: dict[str, Any], reason: str
) -> None:
    value = batch_message([item_dict(item()), {**item_dict(item()), **change}])
    assert outcome(decode_batch, value) == outcome(decode_batch_head, value) == reason


@pytest.mark.parametrize("field", [b"job-1", b"item-1", b"llama-3-8b"])
def test_a_batch_with_invalid_utf8_in_an_items_string_is_malformed(field: bytes) -> None:
    value = encode_batch(make_batch([item()]))
    broken = value.replace(field, b"\xff" + field[1:])
    assert broken != value
    assert outcome(decode_batch, broken) == outcome(decode_batch_head, broken) == "avro-decode"
