"""The processor's reading of results messages, cut to what the ledger needs.

:func:`decode_completions_head` reads the fields the processor applies a results message with: one
``Completion``, or a ``CompletionBatch`` (one message per batch, walked item by item), in every
schema a consumer app may have written it with. Decoding each completion with fastavro was one of
the three per-item costs that dominated the processor's thread (docs/benchmarks.md, "Where the time
goes"); the other two are the input side, :mod:`processor.wire.heads`.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.item import ItemOutcome
from processor.wire.avro import read_block_count, read_int, read_long, read_str, read_union_index
from processor.wire.completions import (
    PRE_ENDINGS_COMPLETION_BATCH_HEADER,
    PRE_ENDINGS_COMPLETION_HEADER,
    PRE_RETRY_COMPLETION_BATCH_HEADER,
    PRE_RETRY_COMPLETION_HEADER,
    PREVIOUS_COMPLETION_BATCH_HEADER,
    PREVIOUS_COMPLETION_HEADER,
)
from processor.wire.errors import MALFORMED, DecodeError, Malformed
from processor.wire.records import STATUSES
from processor.wire.registry_framing import results_single_object
from processor.wire.schemas import HEADER_SIZE, HEADERS, as_bytes, check_header, finish

_COMPLETION = HEADERS["Completion"]
_COMPLETION_BATCH = HEADERS["CompletionBatch"]


class CompletionHead(NamedTuple):
    item_id: str
    batch_id: str
    consumer: str
    ok: bool
    cache_hit: bool
    cached_tokens: int = 0
    """Prompt tokens served from the engine's prefix cache; 0 in a message written before the field."""
    retriable: bool = False
    """Failed, and worth another try (``Completion.retriable``); False in messages written before it."""


def _read_status(buf: bytes, pos: int) -> tuple[int, int]:
    status, pos = read_long(buf, pos)
    if not 0 <= status < len(STATUSES):
        raise Malformed(f"status symbol {status} does not exist")
    return status, pos


def _skip_reason(buf: bytes, pos: int) -> int:
    """Past a ``reason`` (null or a string), checked but not kept."""
    if buf[pos] == 0:
        return pos + 1
    branch, pos = read_union_index(buf, pos)
    if branch:
        _reason, pos = read_str(buf, pos)
    return pos


def _skip_bytes(buf: bytes, pos: int) -> int:
    """Past a ``bytes`` field without copying it (an output can be kilobytes)."""
    n, pos = read_long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise Malformed(f"length {n} at offset {pos} runs past the end ({len(buf)} bytes)")
    return end


def _read_completion_lead(buf: bytes) -> tuple[str, str, str, int, int]:
    """item_id, batch_id, consumer and status of a Completion, and the position after status."""
    item_id, pos = read_str(buf, HEADER_SIZE)
    _job_id, pos = read_str(buf, pos)
    batch_id, pos = read_str(buf, pos)
    consumer, pos = read_str(buf, pos)
    _name, pos = read_str(buf, pos)
    status, pos = _read_status(buf, pos)
    return item_id, batch_id, consumer, status, pos


def _completion_head(value: bytes) -> CompletionHead:
    """:func:`decode_completion_head` of a message whose header is Completion's (or its previous one's).

    ``cache_hit``, the last field, is the last byte, and ``retriable`` the byte before it.
    ``cached_tokens``, the field before that, is the varint that ends just before it; it is found by
    walking back over its continuation bytes (at most five for an int). In a message written before
    ``retriable`` (``PRE_RETRY``, ``PRE_ENDINGS``) ``cached_tokens`` ends just before ``cache_hit``;
    in one written before ``cached_tokens`` it is 0.
    """
    try:
        item_id, batch_id, consumer, status, pos = _read_completion_lead(value)
        flag = value[-1]
        header = value[:HEADER_SIZE]
        previous = header == PREVIOUS_COMPLETION_HEADER
        current = not previous and header not in _PRE_RETRY_HEADERS
        # the fixed minimum of the rest: reason null (1), 3 ints (3), empty output (1), 3 longs (3),
        # attempt and retriable (2, current only), cached_tokens (1, not in the previous schema), flag (1)
        if flag > 1 or len(value) - pos < (9 if previous else 12 if current else 10):
            raise Malformed("the record does not end in a boolean")
        if (retriable := current and value[-2]) > 1:
            raise Malformed(f"boolean byte {value[-2]}")
        cached = 0 if previous else _int_before(value, len(value) - 1 - current, pos)
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed Completion: {exc}") from None
    return CompletionHead(
        item_id, batch_id, consumer, status == 0, flag == 1, cached, retriable == 1 == status
    )


def _int_before(buf: bytes, end: int, floor: int) -> int:
    """The Avro int whose varint ends at ``end`` (exclusive): its last byte is under 0x80, the bytes
    before it that belong to it are 0x80 or more (at most four of them), none before ``floor``."""
    start = end - 1
    while start > floor and end - start < 5 and buf[start - 1] >= 0x80:
        start -= 1
    if start > floor and buf[start - 1] >= 0x80:
        raise Malformed(f"an over-long varint ends at offset {end}")
    value, pos = read_int(buf, start)
    if pos != end:
        raise Malformed(f"no int ends at offset {end}")
    return value


def decode_completion_head(value: bytes | bytearray | memoryview | None) -> CompletionHead:
    """The fields the processor applies a completion with.

    Only the leading fields are parsed: ``cache_hit``, the record's last field, is a boolean, so in
    a well-formed message it is the last byte. The fields in between (reason, token counts, output,
    timings) are the consumer's report, not read by the processor; ``tokenfabric audit`` decodes
    every completion in full. :func:`decode_completion_head_strict` checks the whole record (tests).
    """
    value = as_bytes(value)
    if value[:HEADER_SIZE] not in _COMPLETION_HEADERS:
        check_header(value, "Completion")
    return _completion_head(value)


def decode_completion_head_strict(value: bytes | bytearray | memoryview | None) -> CompletionHead:
    """:func:`decode_completion_head`, checking every field of the record on the way."""
    value = as_bytes(value)
    if value[:HEADER_SIZE] not in _COMPLETION_HEADERS:
        check_header(value, "Completion")
    try:
        buf = value
        item_id, batch_id, consumer, status, pos = _read_completion_lead(buf)
        pos = _skip_reason(buf, pos)
        for _field in ("input_tokens", "output_tokens", "padded_tokens"):
            _n, pos = read_int(buf, pos)
        pos = _skip_bytes(buf, pos)
        for _field in ("queued_ms", "engine_ms", "completed_ms"):
            _n, pos = read_long(buf, pos)
        cached, retriable = 0, 0
        current = value[:HEADER_SIZE] not in (PREVIOUS_COMPLETION_HEADER, *_PRE_RETRY_HEADERS)
        if current:
            _attempt, pos = read_int(buf, pos)
        if value[:HEADER_SIZE] != PREVIOUS_COMPLETION_HEADER:
            cached, pos = read_int(buf, pos)
        if current:
            retriable, pos = buf[pos], pos + 1
        flag = buf[pos]
        if flag > 1 or retriable > 1:
            raise Malformed(f"boolean byte {max(flag, retriable)}")
        pos += 1
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed Completion: {exc}") from None
    finish(value, pos, "Completion")
    return CompletionHead(
        item_id, batch_id, consumer, status == 0, flag == 1, cached, retriable == 1 and status == 1
    )


class CompletionsHead(NamedTuple):
    """What the processor applies a results message with, whichever form it has.

    ``items`` holds an :class:`~processor.core.item.ItemOutcome` per item (``item_id``, ``ok``,
    ``cache_hit``): the core's typed record of an answer, a named tuple, so the core's ``items_done``
    takes the list as it is, and built without its Python ``__new__`` (cheaper per item, measured).
    ``cached_tokens`` holds each item's ``cached_tokens``, in the same order (0 in messages written
    before the field): a list of its own, so the outcomes keep the shape ``items_done`` takes. ``retriable``
    names the items that failed with ``retriable`` set (the core's ``items_done(retriable=...)``).
    """

    batch_id: str
    consumer: str
    items: list[ItemOutcome]
    cached_tokens: list[int]
    retriable: list[str] | tuple[()] = ()


def decode_completions_head(value: bytes | bytearray | memoryview | None) -> CompletionsHead:
    """The processor's reading of a results message: a ``Completion`` or a ``CompletionBatch``.

    A batch is walked to its end (its items are what the processor needs) and checked as
    :func:`decode_completions` checks it: what that decoder refuses, this one refuses too
    (it is stricter where fastavro is lax: over-long varints, negative indexes, boolean bytes).
    A single ``Completion`` is read as :func:`decode_completion_head` reads it; a registry-framed
    batch as :func:`~processor.wire.registry_framing.results_single_object` says.
    """
    value = results_single_object(as_bytes(value))
    header = value[:HEADER_SIZE]
    if header in _COMPLETION_BATCH_HEADERS:
        try:
            head, pos = _read_batch_head(
                value, header != PREVIOUS_COMPLETION_BATCH_HEADER, header not in _PRE_RETRY_BATCH_HEADERS
            )
        except MALFORMED as exc:
            raise DecodeError("avro-decode", f"malformed CompletionBatch: {exc}") from None
        finish(value, pos, "CompletionBatch")
        return head
    if header not in _COMPLETION_HEADERS:
        check_header(value, "Completion")
    one = _completion_head(value)
    again = [one.item_id] if one.retriable else ()
    return CompletionsHead(
        one.batch_id,
        one.consumer,
        [ItemOutcome(one.item_id, one.ok, one.cache_hit)],
        [one.cached_tokens],
        again,
    )


_PRE_RETRY_HEADERS = (PRE_ENDINGS_COMPLETION_HEADER, PRE_RETRY_COMPLETION_HEADER)
_PRE_RETRY_BATCH_HEADERS = (
    PREVIOUS_COMPLETION_BATCH_HEADER,
    PRE_ENDINGS_COMPLETION_BATCH_HEADER,
    PRE_RETRY_COMPLETION_BATCH_HEADER,
)
_COMPLETION_HEADERS = (_COMPLETION, PREVIOUS_COMPLETION_HEADER, *_PRE_RETRY_HEADERS)
_COMPLETION_BATCH_HEADERS = (_COMPLETION_BATCH, *_PRE_RETRY_BATCH_HEADERS)
"""Every schema a results message may be written with: the current one, and those before
``cached_tokens``, before ``cancelled`` and ``expired`` and before ``attempt`` and ``retriable``."""


# The usual one-byte encodings, tested before calling a reader: a function call per field is most
# of the cost of walking an item. A byte under 0x80 is a whole varint, and any one-byte varint fits
# an int; the zigzag of the status index 0, 1, 2 is the byte 0, 2, 4.
_STATUS_BYTE = {2 * i: i for i in range(len(STATUSES))}


def _read_batch_head(buf: bytes, with_cached: bool, with_retry: bool) -> tuple[CompletionsHead, int]:
    """The head of a CompletionBatch; ``with_cached`` False for one written before ``cached_tokens``,
    ``with_retry`` False for one written before ``retriable`` and ``attempt``."""
    batch_id, pos = read_str(buf, HEADER_SIZE)
    consumer, pos = read_str(buf, pos)
    _name, pos = read_str(buf, pos)
    _padded, pos = read_int(buf, pos)
    _engine_ms, pos = read_long(buf, pos)
    _completed_ms, pos = read_long(buf, pos)
    items: list[ItemOutcome] = []
    append, new = items.append, tuple.__new__  # an ItemOutcome without its Python-level __new__
    cached: list[int] = []
    retriable: list[str] = []
    size = len(buf)
    count, pos = read_block_count(buf, pos)
    while count:
        for _ in range(count):
            n = buf[pos]  # item_id: a length under 64 bytes inline, as read_str reads it
            end = pos + 1 + (n >> 1)
            if n < 0x80 and not n & 1 and end <= size:
                item_id, pos = buf[pos + 1 : end].decode("utf-8"), end
            else:
                item_id, pos = read_str(buf, pos)
            status = _STATUS_BYTE.get(buf[pos])
            if status is None:
                status, pos = _read_status(buf, pos)
            else:
                pos += 1
            flag = buf[pos]
            if flag > 1:
                raise Malformed(f"boolean byte {flag}")
            append(new(ItemOutcome, (item_id, status == 0, flag == 1)))
            pos += 1
            if not with_cached:
                cached.append(0)
            elif buf[pos] < 0x80:  # cached_tokens: one byte up to 63
                cached.append((buf[pos] >> 1) ^ -(buf[pos] & 1))
                pos += 1
            elif buf[pos + 1] < 0x80:  # two bytes: up to 8,191
                n = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
                cached.append((n >> 1) ^ -(n & 1))
                pos += 2
            else:
                n, pos = read_int(buf, pos)
                cached.append(n)
            if with_retry:
                again = buf[pos]  # retriable, then attempt (not read: the core knows each item's)
                if again > 1:
                    raise Malformed(f"boolean byte {again}")
                if again and status == 1:
                    retriable.append(item_id)
                _attempt, pos = (0, pos + 2) if buf[pos + 1] < 0x80 else read_int(buf, pos + 1)
            pos = _skip_outcome_rest(buf, pos)
        count, pos = read_block_count(buf, pos)
    return CompletionsHead(batch_id, consumer, items, cached, retriable or ()), pos


def _skip_outcome_rest(buf: bytes, pos: int) -> int:
    """Past an ItemOutcome's fields after ``cached_tokens``: job_id, reason, two ints, output, queued_ms.
    The usual cases (no job id, reason or output; ints of one or two bytes) inline, a call for the rest."""
    if buf[pos] == 0:  # no job_id
        pos += 1
    else:
        _job_id, pos = read_str(buf, pos)
    pos = pos + 1 if buf[pos] == 0 else _skip_reason(buf, pos)
    for _field in ("input_tokens", "output_tokens"):
        if buf[pos] < 0x80:
            pos += 1
        elif buf[pos + 1] < 0x80:  # any two-byte varint is an int
            pos += 2
        else:
            _n, pos = read_int(buf, pos)
    pos = pos + 1 if buf[pos] == 0 else _skip_bytes(buf, pos)  # output
    if buf[pos] < 0x80:  # queued_ms
        return pos + 1
    if buf[pos + 1] < 0x80:
        return pos + 2
    _queued_ms, pos = read_long(buf, pos)
    return pos
