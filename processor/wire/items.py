"""TokenItem and Batch, encoded and decoded by hand (the hot path).

Why by hand: every input message is a ``TokenItem``, and a decoder for its fixed field layout is
measured faster than fastavro's generic ``schemaless_reader`` (numbers in docs/wire-format.md,
``benchmarks/bench_codec.py`` reproduces them), and stricter where fastavro is laxer than the spec.
The fastavro path (:mod:`processor.wire.fastavro_io`) is kept as the reference: the tests check that
both give the same record or the same error on generated input (except that fastavro accepts
over-long varints and negative union indexes), and that the hand-written encoder writes the same bytes
as fastavro's writer. Batches reuse the same item code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from processor.core.item import Batch
from processor.core.signature import to_signed
from processor.wire.avro import (
    U64,
    encode_bytes,
    encode_int,
    encode_long,
    encode_str,
    read_block_count,
    read_int,
    read_int_array,
    read_long,
    read_long_slow,
    read_signature,
    read_str,
    read_str_array,
    read_str_map,
    read_union_index,
    skip_long,
)
from processor.wire.errors import MALFORMED, DecodeError, Malformed
from processor.wire.records import BatchRecord, TokenItemRecord, check_item, item_problem
from processor.wire.request import GenerationRequest, request_problem
from processor.wire.request_codec import encode_request_field, read_request_field
from processor.wire.schemas import (
    BATCH_HEADER,
    FRAME_SIZE,
    HEADER_SIZE,
    PRE_ATTEMPTS_BATCH_HEADER,
    PREVIOUS_BATCH_HEADER,
    PREVIOUS_TOKEN_ITEM_HEADER,
    TOKEN_ITEM_HEADER,
    as_bytes,
    check_header,
    finish,
)

# A frozen dataclass's __init__ stores each field through object.__setattr__ (about 1 us for
# TokenItemRecord); the decoder fills the slots through their descriptors instead (about 0.4 us).
# The field list is checked here so adding a field to TokenItemRecord fails loudly at import.
_ITEM_FIELDS = (
    "item_id", "job_id", "model", "shape", "token_count", "tokens",
    "shape_components", "produced_ms", "output_budget", "metadata", "request",
)  # fmt: skip


if tuple(f.name for f in fields(TokenItemRecord)) != _ITEM_FIELDS:  # pragma: no cover
    raise ImportError("codec: TokenItemRecord fields changed; update _new_item_record")

(_s_id, _s_job, _s_model, _s_shape, _s_count, _s_tokens, _s_comp, _s_ms, _s_budget, _s_meta, _s_request) = (
    getattr(TokenItemRecord, name).__set__ for name in _ITEM_FIELDS
)

_object_new = object.__new__


def new_item_record(
    item_id: str,
    job_id: str,
    model: str,
    shape: int,
    token_count: int,
    tokens: bytes,
    components: tuple[str, ...] | None,
    produced_ms: int,
    output_budget: int | None,
    metadata: dict[str, str] | None,
    request: GenerationRequest | None = None,
) -> TokenItemRecord:
    rec = _object_new(TokenItemRecord)
    _s_id(rec, item_id)
    _s_job(rec, job_id)
    _s_model(rec, model)
    _s_shape(rec, shape)
    _s_count(rec, token_count)
    _s_tokens(rec, tokens)
    _s_comp(rec, components)
    _s_ms(rec, produced_ms)
    _s_budget(rec, output_budget)
    _s_meta(rec, metadata)
    _s_request(rec, request)
    return rec


def read_item_lead(buf: bytes, pos: int) -> tuple[str, bytes, bytes, int]:
    """A TokenItem's first three fields: ``item_id`` decoded, ``job_id`` and ``model`` as raw UTF-8.

    One call for the three strings, each length's one-byte case inlined: a function call per field
    is a third of the cost of decoding an item. Shared with :mod:`processor.wire.heads`.
    """
    size = len(buf)
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = read_long_slow(buf, pos)
    end = pos + n
    if n < 0 or end > size:
        raise Malformed(f"item_id length {n} runs past the end")
    item_id = buf[pos:end].decode("utf-8")
    b = buf[end]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos = end + 1
    else:
        n, pos = read_long_slow(buf, end)
    end = pos + n
    if n < 0 or end > size:
        raise Malformed(f"job_id length {n} runs past the end")
    job_id = buf[pos:end]
    b = buf[end]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos = end + 1
    else:
        n, pos = read_long_slow(buf, end)
    end = pos + n
    if n < 0 or end > size:
        raise Malformed(f"model length {n} runs past the end")
    return item_id, job_id, buf[pos:end], end


_ItemRest = tuple[int, int, int, "tuple[str, ...] | None", int, "int | None", "dict[str, str] | None", int]


def read_item_rest(buf: bytes, pos: int, want_ms: bool = True) -> _ItemRest:
    """The fields after ``shape``: token_count, where the token bytes start and end, components,
    produced_ms, output_budget, metadata, and the position after the record. Shared with fastpath,
    which does not read ``produced_ms`` (``want_ms=False``: checked, skipped, returned as 0).

    The token count and the tokens' byte length are one- or two-byte varints for prompts up to
    8,191 and 2,047 tokens: both cases are inlined (a call to the slow path cost more than the rest).
    """
    b = buf[pos]
    if b < 0x80:
        token_count = (b >> 1) ^ -(b & 1)
        pos += 1
    elif buf[pos + 1] < 0x80:
        n = (b & 0x7F) | (buf[pos + 1] << 7)
        token_count = (n >> 1) ^ -(n & 1)
        pos += 2
    else:
        token_count, pos = read_int(buf, pos)
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    elif buf[pos + 1] < 0x80:
        n = (b & 0x7F) | (buf[pos + 1] << 7)
        n = (n >> 1) ^ -(n & 1)
        pos += 2
    else:
        n, pos = read_long_slow(buf, pos)
    start, end = pos, pos + n
    if n < 0 or end > len(buf):
        raise Malformed(f"tokens length {n} runs past the end")
    pos = end
    # shape_components: union {null, array<string>}; a null branch is the single byte 0
    components: tuple[str, ...] | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = read_union_index(buf, pos)
        if branch:
            components, pos = read_str_array(buf, pos)
    if want_ms:
        produced_ms, pos = read_long_slow(buf, pos)
    else:
        produced_ms, pos = 0, skip_long(buf, pos)
    output_budget: int | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = read_union_index(buf, pos)
        if branch:
            output_budget, pos = read_int(buf, pos)
    metadata: dict[str, str] | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = read_union_index(buf, pos)
        if branch:
            metadata, pos = read_str_map(buf, pos)
    return token_count, start, end, components, produced_ms, output_budget, metadata, pos


def _read_item_body(
    buf: bytes, pos: int, with_request: bool, final: bool
) -> tuple[TokenItemRecord, str | None, int]:
    """One TokenItem body at ``pos``; well-formed Avro, not yet checked by :func:`check_item`: the
    record, its request's problem (for ``check_item``) and the position after it. ``with_request``:
    written with the current schema (the previous one has no ``request``); ``final``: the record
    should end the message (an input message, not a batch's item)."""
    item_id, job_id, model, pos = read_item_lead(buf, pos)
    shape, pos = read_signature(buf, pos)
    token_count, start, end, components, produced_ms, output_budget, metadata, pos = read_item_rest(buf, pos)
    request: GenerationRequest | None = None
    fault: str | None = None
    if with_request:
        if buf[pos] == 0:  # no request, the usual: one byte
            pos += 1
        else:
            request, fault, pos = read_request_field(buf, pos, final)
    rec = new_item_record(
        item_id,
        job_id.decode("utf-8"),
        model.decode("utf-8"),
        shape,
        token_count,
        buf[start:end],
        components,
        produced_ms,
        output_budget,
        metadata,
        request,
    )
    return rec, fault, pos


def decode_token_item(value: bytes | bytearray | memoryview | None) -> TokenItemRecord:
    """Decode one input message (the hot path), also one written before ``request``
    (``PREVIOUS_TOKEN_ITEM_HEADER``: no request). Raises :class:`DecodeError` and nothing else."""
    value = as_bytes(value)
    header = value[:HEADER_SIZE]
    current = header == TOKEN_ITEM_HEADER
    if not current and header != PREVIOUS_TOKEN_ITEM_HEADER:
        check_header(value, "TokenItem")
    try:
        rec, fault, pos = _read_item_body(value, HEADER_SIZE, current, True)
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed TokenItem: {exc}") from None
    finish(value, pos, "TokenItem")
    check_item(rec, fault)
    return rec


def batch_form(value: bytes) -> tuple[bool, bool]:
    """Whether a Batch message's items carry ``request`` and whether it ends with ``attempts``, from
    its header: the current schema, the one before ``attempts`` (``PRE_ATTEMPTS_BATCH_HEADER``, what
    the processor writes while every item is on its first attempt) or the one before ``request``
    (``PREVIOUS_BATCH_HEADER``). Raises ``DecodeError`` for any other header."""
    header = value[:HEADER_SIZE]
    if header == PRE_ATTEMPTS_BATCH_HEADER:
        return True, False
    if header == BATCH_HEADER:
        return True, True
    if header != PREVIOUS_BATCH_HEADER:
        check_header(value, "Batch")
    return False, False


def read_attempts(value: bytes, pos: int, items: int) -> tuple[list[int], int]:
    """A Batch's ``attempts`` (an array of ints) and the position after it. Raises ``Malformed``
    unless it is empty or holds one attempt of at least 1 per item."""
    attempts, pos = read_int_array(value, pos)
    if attempts and (len(attempts) != items or min(attempts) < 1):
        raise Malformed(f"attempts {list(attempts[:8])} for {items} items: one per item, each at least 1")
    return list(attempts), pos


def decode_batch(value: bytes | bytearray | memoryview | None) -> BatchRecord:
    """Decode a batch (what a consumer reads), also one written before ``attempts`` or before
    ``request`` (:func:`batch_form`). Each item obeys the same rules as an input item."""
    value = as_bytes(value)
    current, with_attempts = batch_form(value)
    attempts: list[int] = []
    try:
        lead, pos = read_batch_lead(value)
        items: list[TokenItemRecord] = []
        faults: list[str | None] = []
        count, pos = read_block_count(value, pos)
        while count:
            for _ in range(count):
                item, fault, pos = _read_item_body(value, pos, current, False)
                items.append(item)
                faults.append(fault)
            count, pos = read_block_count(value, pos)
        if with_attempts:
            attempts, pos = read_attempts(value, pos, len(items))
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed Batch: {exc}") from None
    finish(value, pos, "Batch")
    for item, fault in zip(items, faults, strict=True):
        check_item(item, fault)
    batch_id, consumer, model, shape, lane, padded_length, pad_multiple, created_ms, oversized = lead
    return BatchRecord(
        batch_id=batch_id,
        consumer=consumer,
        model=model,
        shape=shape,
        lane=lane,
        padded_length=padded_length,
        pad_multiple=pad_multiple,
        created_ms=created_ms,
        oversized=oversized,
        items=items,
        attempts=attempts,
    )


def read_batch_lead(value: bytes) -> tuple[tuple[str, str, str, int, int, int, int, int, bool], int]:
    """A Batch's fields before its items, in :class:`BatchRecord` order (shape unsigned), and the
    position of the items. Raises what the readers raise on a malformed record (``_MALFORMED``)."""
    pos = HEADER_SIZE
    batch_id, pos = read_str(value, pos)
    consumer, pos = read_str(value, pos)
    model, pos = read_str(value, pos)
    shape, pos = read_long(value, pos)
    lane, pos = read_int(value, pos)
    padded_length, pos = read_int(value, pos)
    pad_multiple, pos = read_int(value, pos)
    created_ms, pos = read_long(value, pos)
    flag = value[pos]
    if flag > 1:
        raise Malformed(f"boolean byte {flag}")
    lead = (batch_id, consumer, model, shape & U64, lane, padded_length, pad_multiple, created_ms, flag == 1)
    return lead, pos + 1


def _item_parts(rec: TokenItemRecord, out: list[bytes | memoryview]) -> None:
    """Append the Avro body of one TokenItem to ``out`` (shared by item and batch encoders)."""
    fault = None if rec.request is None else request_problem(rec.request)
    problem = item_problem(rec.item_id, rec.model, rec.token_count, rec.tokens, fault)
    if problem is not None:
        raise ValueError(problem[1])
    out += (
        encode_str(rec.item_id),
        encode_str(rec.job_id),
        encode_str(rec.model),
        encode_long(to_signed(rec.shape)),
        encode_int(rec.token_count, "token_count"),
        encode_bytes(bytes(rec.tokens)),
    )
    components = rec.shape_components
    if components is None:
        out.append(b"\x00")
    else:
        out.append(b"\x02")
        if components:
            out.append(encode_long(len(components)))
            out += (encode_str(c) for c in components)
        out.append(b"\x00")
    out.append(encode_long(rec.produced_ms))
    if rec.output_budget is None:
        out.append(b"\x00")
    else:
        out += (b"\x02", encode_int(rec.output_budget, "output_budget"))
    metadata = rec.metadata
    if metadata is None:
        out.append(b"\x00")
    else:
        out.append(b"\x02")
        if metadata:
            out.append(encode_long(len(metadata)))
            for key, val in metadata.items():
                out += (encode_str(key), encode_str(val))
        out.append(b"\x00")
    out.append(encode_request_field(rec.request))


def encode_token_item(rec: TokenItemRecord) -> bytes:
    """One input message. Raises ``ValueError`` for a record :func:`decode_token_item` would reject."""
    out: list[bytes | memoryview] = [TOKEN_ITEM_HEADER]
    _item_parts(rec, out)
    return b"".join(out)


def _encode_batch_parts(
    batch: Batch | BatchRecord,
    records: Sequence[TokenItemRecord | bytes | memoryview],
    attempts: Sequence[int],
) -> bytes:
    """The Batch message; with the header before ``attempts`` (and no ``attempts``) while every item
    is on its first attempt, so that the bytes are those a processor wrote before retries existed."""
    retried = attempts.count(1) != len(attempts)  # any attempt past the first (counted in C)
    if retried and (len(attempts) != len(records) or min(attempts) < 1):
        raise ValueError(f"attempts {list(attempts)[:8]} for {len(records)} items: one per item, each >= 1")
    out: list[bytes | memoryview] = [
        BATCH_HEADER if retried else PRE_ATTEMPTS_BATCH_HEADER,
        encode_str(batch.batch_id),
        encode_str(batch.consumer),
        encode_str(batch.model),
        encode_long(to_signed(batch.shape)),
        encode_int(batch.lane, "lane"),
        encode_int(batch.padded_length, "padded_length"),
        encode_int(batch.pad_multiple, "pad_multiple"),
        encode_long(batch.created_ms),
        b"\x01" if batch.oversized else b"\x00",
    ]
    if records:
        out.append(encode_long(len(records)))
        for rec in records:
            if isinstance(rec, bytes | memoryview):
                # an input message, validated when it was decoded: its body, past the header (or
                # the registry frame: heads.framed_item_head), as it is; one written before
                # ``request`` gets the field, null (its one byte, 0)
                out.append(memoryview(rec)[FRAME_SIZE if rec[0] == 0 else HEADER_SIZE :])
                if type(rec) is bytes and rec.startswith(PREVIOUS_TOKEN_ITEM_HEADER):
                    out.append(b"\x00")
            else:
                _item_parts(rec, out)
    out.append(b"\x00")
    if retried:
        out += (encode_long(len(attempts)), *(encode_int(a, "attempt") for a in attempts), b"\x00")
    return b"".join(out)


def encode_batch(batch: Batch) -> bytes:
    """A batch for its consumer; each ``batch.items[i].payload`` is a :class:`TokenItemRecord` or the
    ``bytes`` of its whole input message (``fastpath.ItemHead.message``).

    The bytes of an item inside the batch are exactly its input message minus the 10-byte header, so
    a kept message is spliced in past its header, and a record is re-encoded (no decode round trip);
    a message written before ``request`` (``PREVIOUS_TOKEN_ITEM_HEADER``) gets the null request
    byte after it, so every item of the batch follows the current schema.
    The message is kept whole rather than as a copy of its body: the copy was a tenth of the cost of
    taking an item in (docs/benchmarks.md), and the header's 10 bytes are all it saved.
    """
    records: list[TokenItemRecord | bytes | memoryview] = [item.payload for item in batch.items]
    for item, payload in zip(batch.items, records, strict=True):
        if type(payload) is not bytes and not isinstance(payload, TokenItemRecord | memoryview):
            raise TypeError(f"item {item.id!r}: payload is {type(payload).__name__}, not TokenItemRecord")
    return _encode_batch_parts(batch, records, [item.attempt for item in batch.items])


def encode_batch_record(batch: BatchRecord) -> bytes:
    """Same wire form as :func:`encode_batch`, from a decoded :class:`BatchRecord` (its ``attempts``
    empty or all 1: the header before ``attempts``)."""
    return _encode_batch_parts(batch, batch.items, batch.attempts)
