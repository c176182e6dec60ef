"""Builders, reference encodings (fastavro) and hypothesis strategies shared by the wire-format tests.

The hand-written codec is checked against fastavro: :func:`fastavro_message` writes the same records
with fastavro's own schemaless writer, bypassing the codec's checks, so a test can compare bytes or
break a rule the encoder enforces."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import fastavro
import pytest
from hypothesis import strategies as st

from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.signature import shape_signature, to_signed
from processor.wire.completions import decode_completion, decode_completion_batch, decode_completions
from processor.wire.control import decode_any, decode_contract, decode_dead_letter, decode_ledger_snapshot
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import PRE_ATTEMPTS_BATCH, decode_token_item_fastavro
from processor.wire.items import decode_batch, decode_token_item, encode_token_item
from processor.wire.records import (
    STATUSES,
    BatchRecord,
    CompletionBatchRecord,
    CompletionRecord,
    ContractRecord,
    DeadLetterRecord,
    ItemOutcomeRecord,
    LedgerSnapshotRecord,
    TokenItemRecord,
    tokens_from_ids,
)
from processor.wire.request import GenerationRequest
from processor.wire.request_codec import request_to_avro
from processor.wire.schemas import HEADER_SIZE, HEADERS, parsed_schema, schema_of

U64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------------------
# helpers


def item(**changes: Any) -> TokenItemRecord:
    fields: dict[str, Any] = {
        "item_id": "item-1",
        "job_id": "job-1",
        "model": "llama-3-8b",
        "shape": shape_signature(["system: be brief", "tools: none"]),
        "token_count": 3,
        "tokens": tokens_from_ids([1, 70000, 2**32 - 1]),
        "shape_components": ("system: be brief", "tools: none"),
        "produced_ms": 1_732_000_000_123,
        "output_budget": 256,
        "metadata": {"tenant": "acme", "ключ": "значение"},
    }
    fields.update(changes)
    return TokenItemRecord(**fields)


def item_dict(rec: TokenItemRecord) -> dict[str, Any]:
    """The record as fastavro's writer wants it (the reference encoding)."""
    return {
        "item_id": rec.item_id,
        "job_id": rec.job_id,
        "model": rec.model,
        "shape": to_signed(rec.shape),
        "token_count": rec.token_count,
        "tokens": rec.tokens,
        "shape_components": None if rec.shape_components is None else list(rec.shape_components),
        "produced_ms": rec.produced_ms,
        "output_budget": rec.output_budget,
        "metadata": rec.metadata,
        "request": request_to_avro(rec.request),
    }


def fastavro_message(name: str, record: dict[str, Any]) -> bytes:
    """Header + fastavro's schemaless encoding, bypassing the codec's own checks."""
    out = io.BytesIO()
    out.write(HEADERS[name])
    fastavro.schemaless_writer(out, parsed_schema(name), record)
    return out.getvalue()


def raw_item(**changes: Any) -> bytes:
    """A TokenItem message written by fastavro, so it can break the item rules."""
    d = item_dict(item())
    d.update(changes)
    return fastavro_message("TokenItem", d)


ITEM_DECODERS = [decode_token_item, decode_token_item_fastavro]
ITEM_DECODER_IDS = ["hand", "fastavro"]


def reason_of(decoder: Any, value: Any) -> str:
    with pytest.raises(DecodeError) as info:
        decoder(value)
    return info.value.reason


# ------------------------------------------------------------------------------------------------
# Batch


def make_batch(records: list[TokenItemRecord], **changes: Any) -> Batch:
    fields: dict[str, Any] = {
        "batch_id": "b-1",
        "consumer": "gpu-0",
        "model": "llama-3-8b",
        "shape": records[0].shape if records else 0,
        "lane": 3,
        "pad_multiple": 8,
        "padded_length": 16,
        "items": [Item(r.item_id, r.model, r.shape, r.token_count, arrival_ms=5, payload=r) for r in records],
        "created_ms": 1_732_000_000_999,
        "oversized": False,
    }
    fields.update(changes)
    return Batch(**fields)


def batch_records(batch: Batch) -> BatchRecord:
    return BatchRecord(
        batch_id=batch.batch_id,
        consumer=batch.consumer,
        model=batch.model,
        shape=batch.shape,
        lane=batch.lane,
        padded_length=batch.padded_length,
        pad_multiple=batch.pad_multiple,
        created_ms=batch.created_ms,
        oversized=batch.oversized,
        items=[i.payload for i in batch.items],
        attempts=[i.attempt for i in batch.items] if any(i.attempt != 1 for i in batch.items) else [],
    )


def fastavro_batch(rec: BatchRecord) -> bytes:
    """``rec`` as fastavro writes it in the schema the codec picks: the current one when some item is
    past its first attempt, else the one before ``attempts``."""
    fields = {
        "batch_id": rec.batch_id,
        "consumer": rec.consumer,
        "model": rec.model,
        "shape": to_signed(rec.shape),
        "lane": rec.lane,
        "padded_length": rec.padded_length,
        "pad_multiple": rec.pad_multiple,
        "created_ms": rec.created_ms,
        "oversized": rec.oversized,
        "items": [item_dict(i) for i in rec.items],
    }
    if any(a != 1 for a in rec.attempts):
        return fastavro_message("Batch", {**fields, "attempts": rec.attempts})
    return PRE_ATTEMPTS_BATCH.encode(fields)


BATCH_ITEMS = [
    item(),
    item(item_id="item-2", job_id="", shape_components=None, output_budget=None, metadata=None),
    item(item_id="item-3", token_count=1, tokens=tokens_from_ids([7]), metadata={}),
]


def batch_message(items: list[dict[str, Any]]) -> bytes:
    """A Batch message written by fastavro, so its items may break the rules the encoder enforces."""
    batch = {
        "batch_id": "b",
        "consumer": "c",
        "model": "m",
        "shape": 0,
        "lane": 0,
        "padded_length": 8,
        "pad_multiple": 8,
        "created_ms": 0,
        "oversized": False,
        "items": items,
    }
    return fastavro_message("Batch", batch)


# ------------------------------------------------------------------------------------------------
# the other records


def completion_rec(**changes: Any) -> CompletionRecord:
    fields: dict[str, Any] = {
        "item_id": "item-1",
        "job_id": "job-1",
        "batch_id": "b-1",
        "consumer": "gpu-0",
        "model": "llama-3-8b",
        "status": "ok",
        "reason": None,
        "input_tokens": 100,
        "output_tokens": 20,
        "padded_tokens": 104,
        "output": b"\x00\x01opaque",
        "queued_ms": 12,
        "engine_ms": 340,
        "completed_ms": 1_732_000_000_500,
        "cached_tokens": 64,
        "cache_hit": True,
    }
    fields.update(changes)
    return CompletionRecord(**fields)


def batch_of(*records: CompletionRecord) -> CompletionBatchRecord:
    return CompletionBatchRecord.of(records)


def completion_batch_dict(rec: CompletionBatchRecord) -> dict[str, Any]:
    return dataclasses.asdict(rec)


OTHER_DECODERS = [
    decode_completion,
    decode_completion_batch,
    decode_completions,
    decode_contract,
    decode_ledger_snapshot,
    decode_dead_letter,
]


# ------------------------------------------------------------------------------------------------
# hypothesis

text = st.text(max_size=12)
names = st.text(min_size=1, max_size=12)
model_names = names.filter(lambda name: "@" not in name)
"""Model names: "@" joins a model and an adapter in a serving key, so no model holds one."""
int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)

JSON_OBJECTS = ('{"type": "object", "properties": {"label": {"type": "string"}}}', "{}", '{"a": [1, 2]}')
"""JSON texts of an object, for ``json_schema`` and ``extra``."""


@st.composite
def generation_requests(draw: st.DrawFn) -> GenerationRequest:
    """Valid requests (``request_problem`` is None), each field set or left to the consumer."""
    constraint = draw(st.sampled_from(["none", "json_schema", "choices", "regex"]))
    nonempty = st.text(min_size=1, max_size=8)
    return GenerationRequest(
        adapter=draw(st.just("") | model_names),
        priority=draw(int32),
        temperature=draw(st.none() | st.floats(0, 2, allow_nan=False)),
        top_p=draw(st.none() | st.floats(0, 1, exclude_min=True)),
        top_k=draw(st.none() | st.integers(0, (1 << 31) - 1)),
        seed=draw(st.none() | int64),
        stop=tuple(draw(st.lists(nonempty, max_size=3))),
        stop_token_ids=tuple(draw(st.lists(int32, max_size=3))),
        logprobs=draw(st.none() | st.integers(0, 20)),
        json_schema=draw(st.sampled_from(JSON_OBJECTS)) if constraint == "json_schema" else None,
        choices=tuple(draw(st.lists(nonempty, min_size=1, max_size=3))) if constraint == "choices" else (),
        regex=draw(text) if constraint == "regex" else None,
        extra=draw(st.none() | st.sampled_from(JSON_OBJECTS)),
    )


@st.composite
def token_items(draw: st.DrawFn) -> TokenItemRecord:
    ids = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40))
    return TokenItemRecord(
        item_id=draw(names),
        job_id=draw(text),
        model=draw(model_names),
        shape=draw(st.integers(0, U64)),
        token_count=len(ids),
        tokens=tokens_from_ids(ids),
        shape_components=draw(st.none() | st.lists(text, max_size=4).map(tuple)),
        produced_ms=draw(int64),
        output_budget=draw(st.none() | int32),
        metadata=draw(st.none() | st.dictionaries(text, text, max_size=3)),
        request=draw(st.none() | generation_requests()),
    )


completions = st.builds(
    CompletionRecord,
    item_id=text,
    job_id=text,
    batch_id=text,
    consumer=text,
    model=text,
    status=st.sampled_from(STATUSES),
    reason=st.none() | text,
    input_tokens=int32,
    output_tokens=int32,
    padded_tokens=int32,
    output=st.binary(max_size=40),
    queued_ms=int64,
    engine_ms=int64,
    completed_ms=int64,
    cached_tokens=int32,
    cache_hit=st.booleans(),
    attempt=int32,
    retriable=st.booleans(),
)
outcomes = st.builds(
    ItemOutcomeRecord,
    item_id=text,
    status=st.sampled_from(STATUSES),
    cache_hit=st.booleans(),
    cached_tokens=int32,
    retriable=st.booleans(),
    attempt=int32,
    job_id=text,
    reason=st.none() | text,
    input_tokens=int32,
    output_tokens=int32,
    output=st.binary(max_size=40),
    queued_ms=int64,
)
completion_batches = st.builds(
    CompletionBatchRecord,
    batch_id=text,
    consumer=text,
    model=text,
    padded_tokens=int32,
    engine_ms=int64,
    completed_ms=int64,
    items=st.lists(outcomes, max_size=5),
)
counter_maps = st.dictionaries(text, int64, max_size=4)
snapshots = st.builds(
    LedgerSnapshotRecord,
    instance=text,
    taken_ms=int64,
    sequence=int64,
    counters=counter_maps,
    per_model=st.dictionaries(text, counter_maps, max_size=3),
    per_consumer=st.dictionaries(text, counter_maps, max_size=3),
)
dead_letters = st.builds(
    DeadLetterRecord,
    reason=text,
    source_topic=text,
    partition=int32,
    offset=int64,
    original=st.binary(max_size=60),
    original_key=st.none() | st.binary(max_size=10),
    dead_ms=int64,
    detail=st.none() | text,
)
positive = st.integers(1, (1 << 31) - 1)
consumer_ids = st.text(alphabet="azAZ09._-", min_size=1, max_size=12)
contracts = st.builds(
    ContractRecord,
    st.builds(Contract, consumer_ids, model_names, positive, positive, positive, positive),
    int64,
)
ALL_DECODERS = [
    decode_token_item,
    decode_token_item_fastavro,
    decode_batch,
    *OTHER_DECODERS,
    decode_any,
    schema_of,
]


def only_decode_errors(value: bytes) -> None:
    for decoder in ALL_DECODERS:
        try:
            decoder(value)
        except DecodeError as exc:
            assert exc.reason and str(exc)


def outcome(decoder: Any, value: bytes) -> Any:
    try:
        return decoder(value)
    except DecodeError as exc:
        return exc.reason


@st.composite
def mutated_items(draw: st.DrawFn) -> bytes:
    """A valid TokenItem message with a few bytes changed, cut, or added after the header."""
    return damage(draw, encode_token_item(draw(token_items())))


def damage(draw: st.DrawFn, message: bytes) -> bytes:
    """``message`` with a few bytes changed, cut, or added after the header."""
    value = bytearray(message)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = draw(st.integers(HEADER_SIZE, len(value)))
        if action == "flip" and at < len(value):
            value[at] = draw(st.integers(0, 255))
        elif action == "cut":
            del value[at:]
        elif action == "insert":
            value[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif action == "delete":
            del value[at : at + draw(st.integers(1, 4))]
    return bytes(value)
