"""The processor's per-item wire work, cut to what scheduling needs.

Profiling the processor at 1,000-token items (docs/benchmarks.md, "Where the time goes") found three
per-item costs dominating its one Python thread: decoding each ingest message into a full record,
re-encoding every item into its batch, and decoding each completion with fastavro. This module does
the first two with less (the third is :mod:`processor.wire.completion_heads`):

* :func:`decode_item_head` validates an input message exactly as :func:`decode_token_item`
  does (same reasons, same rules: it is tested against it) but keeps only what the scheduler reads,
  plus the message itself (the ``bytes`` librdkafka handed over, not a copy), so the token ids are
  never sliced out and the record, its boxed ints and its own copy of the model name are never built;
* an item's bytes inside a batch are exactly its input message minus the 10-byte header (plus the
  null request byte for a message written before ``request``), so :func:`encode_batch` splices the
  kept messages instead of re-encoding seven fields per item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from processor.core.serving import SEPARATOR, serving_key
from processor.wire.avro import (
    read_block_count,
    read_signature,
)
from processor.wire.errors import MALFORMED, DecodeError
from processor.wire.items import batch_form, read_attempts, read_batch_lead, read_item_lead, read_item_rest
from processor.wire.records import item_problem
from processor.wire.request import GenerationRequest
from processor.wire.request_codec import read_final_request, read_request_field
from processor.wire.schemas import (
    FRAME_SIZE,
    HEADER_SIZE,
    HEADERS,
    PREVIOUS_TOKEN_ITEM_HEADER,
    as_bytes,
    check_header,
    finish,
)

_TOKEN_ITEM = HEADERS["TokenItem"]
_BATCH = HEADERS["Batch"]
_MODELS: dict[bytes, str] = {}  # one str per model name, not one per item; none holds SEPARATOR
_JOBS: dict[bytes, str] = {}  # one str per job id
_MAX_MODELS = 4096


class ItemHead(NamedTuple):
    """What the scheduler needs of an input message, and the message itself for the batch.

    ``model`` is the item's serving key (processor/core/serving.py): its model, or
    ``model@adapter`` when its request names a LoRA adapter, so the core schedules adapters apart.
    """

    item_id: str
    model: str
    shape: int
    token_count: int
    output_budget: int | None
    message: bytes | memoryview
    """The input message: ``bytes`` as librdkafka handed it over, or (registry-framed, with fields of
    the producer's own after ours) a view of it that ends where our record does."""
    job: str = ""
    """``job_id``: the job whose token share the item counts against (docs/shares.md); "" for none."""


_new_head = tuple.__new__  # NamedTuple's own __new__ is Python code: twice the cost, once per item


class BatchItemHead(NamedTuple):
    """An item of a batch, without its tokens. ``model`` is the item's ``model`` field (its adapter
    is in ``request``; the batch's ``model`` is their serving key)."""

    item_id: str
    model: str
    shape: int
    token_count: int
    output_budget: int | None
    request: GenerationRequest | None = None


class BatchHead(NamedTuple):
    """A batch without its tokens: what a reader needs who answers, counts or audits it."""

    batch_id: str
    consumer: str
    model: str
    shape: int
    lane: int
    padded_length: int
    pad_multiple: int
    created_ms: int
    oversized: bool
    items: list[BatchItemHead]
    attempts: list[int] | tuple[()] = ()
    """Each item's attempt (``Batch.attempts``); empty when every item is on its first."""


def _interned(table: dict[bytes, str], raw: bytes, keep: bool = True) -> str:
    """``raw`` decoded, one str per distinct value (up to ``_MAX_MODELS`` of them) when ``keep``."""
    text = table.get(raw)
    if text is None:
        text = raw.decode("utf-8")
        if keep and len(table) < _MAX_MODELS:
            table[raw] = text
    return text


def _model(raw: bytes) -> str:
    """A model name; one holding SEPARATOR (an invalid item) is not kept, so a hit in ``_MODELS``
    is a valid name (the usual path relies on it)."""
    model = _MODELS.get(raw)
    return model if model is not None else _interned(_MODELS, raw, SEPARATOR.encode() not in raw)


def _job(raw: bytes) -> str:
    return _interned(_JOBS, raw)


def decode_item_head(value: bytes | bytearray | memoryview | None) -> ItemHead:
    """Validate one input message and return its head. Raises :class:`DecodeError` only."""
    if type(value) is bytes:
        head = _usual_head(value)
        if head is not None:
            return head
    return general_item_head(as_bytes(value))


def general_item_head(value: bytes) -> ItemHead:
    """:func:`decode_item_head` for any encoding, a call per field (it reads what the one-pass
    reader hands back, and refuses with the reason; public so that ``bench_codec.py`` can time it).
    A message written before ``request`` (``PREVIOUS_TOKEN_ITEM_HEADER``) reads with none."""
    header = value[:HEADER_SIZE]
    current = header == _TOKEN_ITEM
    if not current and header != PREVIOUS_TOKEN_ITEM_HEADER:
        check_header(value, "TokenItem")
    try:
        item_id, job_id, raw_model, pos = read_item_lead(value, HEADER_SIZE)
        shape, pos = read_signature(value, pos)
        token_count, start, end, _parts, _ms, output_budget, _meta, pos = read_item_rest(value, pos, False)
        request, fault, pos = read_request_field(value, pos, True) if current else (None, None, pos)
        model = _model(raw_model)
        job = _job(job_id) if job_id else ""
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed TokenItem: {exc}") from None
    finish(value, pos, "TokenItem")  # structure first, then the item rules, as decode_token_item
    problem = _head_problem(item_id, model, token_count, end - start, fault)
    if problem is not None:
        raise DecodeError(*problem)
    if request is not None and request.adapter:
        model = serving_key(model, request.adapter)
    return _new_head(ItemHead, (item_id, model, shape, token_count, output_budget, value, job))


def _head_problem(
    item_id: str, model: str, token_count: int, n_bytes: int, fault: str | None
) -> tuple[str, str] | None:
    """:func:`item_problem` of an item read without its tokens (``n_bytes``: their length)."""
    if (
        item_id
        and model
        and token_count >= 1
        and n_bytes == 4 * token_count
        and SEPARATOR not in model
        and fault is None
    ):
        return None
    return item_problem(item_id, model, token_count, b"\0" * max(0, n_bytes), fault)


def framed_item_head(buf: bytes) -> ItemHead | None:
    """The head of a registry-framed message whose writer schema is today's TokenItem (its body is
    ours byte for byte, processor/wire/registry_framing.py), read in place: the head's ``message`` is
    the framed message itself, which :func:`~processor.wire.items.encode_batch` splices past its
    5-byte frame. ``None`` for an item not encoded the usual way (the caller reads it the general
    way)."""
    return _usual_head(buf, FRAME_SIZE)


def framed_head_reader(tail: Callable[[bytes, int], int]) -> Callable[[bytes], ItemHead | None]:
    """:func:`framed_item_head` for a writer schema that is today's TokenItem and then fields of the
    producer's own: ``tail`` checks them (the position after them; raises a ``MALFORMED`` error),
    and the head's ``message`` is a view of the framed message that ends where our record does (no
    copy either)."""

    def read(buf: bytes) -> ItemHead | None:
        return _usual_head(buf, FRAME_SIZE, tail)

    return read


def _usual_head(
    buf: bytes, start: int = HEADER_SIZE, tail: Callable[[bytes, int], int] | None = None
) -> ItemHead | None:
    """The head of an item encoded the usual way (its body from ``start``: past the single-object
    header, or past a registry frame), read in one pass with every check of the general
    path; ``None`` for anything else, which the general path then reads or refuses with its reason.

    The usual way: ids and model name under 64 bytes, no shape components, a six-byte
    ``produced_ms`` (epoch milliseconds from mid-1970 to 2039), no metadata, up to 8,191 tokens, no
    request or one :func:`read_final_request` finds valid (one lookup for a request read before).
    Each field's one case inline instead of a call per field halves the cost of the head, which
    every ingest message and every restored item pays (docs/benchmarks.md). A length running past
    the end shows up as an ``IndexError`` at the next byte read, as every field is followed by one;
    a message written before ``request`` ends one byte earlier.
    """
    if start == HEADER_SIZE:
        current = buf[:HEADER_SIZE] == _TOKEN_ITEM
        if not current and buf[:HEADER_SIZE] != PREVIOUS_TOKEN_ITEM_HEADER:
            return None
    else:  # registry-framed under today's TokenItem (framed_item_head)
        current = True
    try:
        n = buf[start]  # item_id: a non-empty string under 64 bytes
        if n >= 0x80 or n & 1 or not n:
            return None
        pos = start + 1 + (n >> 1)
        item_id = buf[start + 1 : pos].decode("utf-8")
        n = buf[pos]  # job_id
        if n >= 0x80 or n & 1:
            return None
        end = pos + 1 + (n >> 1)
        job = ""
        if n:
            raw = buf[pos + 1 : end]
            job = _JOBS.get(raw) or _job(raw)  # a job seen before: one lookup, no call
        n = buf[end]  # model
        if n >= 0x80 or n & 1 or not n:
            return None
        pos = end + 1 + (n >> 1)
        raw = buf[end + 1 : pos]
        model = _MODELS.get(raw)
        if model is None:
            model = _model(raw)
            if SEPARATOR in model:
                return None
        shape, pos = read_signature(buf, pos)
        b = buf[pos]  # token_count: 1 to 8,191
        if b < 0x80:
            pos += 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        else:
            return None
        if b & 1 or not b:
            return None
        token_count = b >> 1
        b = buf[pos]  # the tokens' byte length, 4 * token_count: up to three bytes
        if b < 0x80:
            pos += 1
        elif buf[pos + 1] < 0x80:
            b = (b & 0x7F) | (buf[pos + 1] << 7)
            pos += 2
        elif buf[pos + 2] < 0x80:
            b = (b & 0x7F) | ((buf[pos + 1] & 0x7F) << 7) | (buf[pos + 2] << 14)
            pos += 3
        else:
            return None
        if b != 8 * token_count:  # the zigzag of 4 * token_count
            return None
        pos += 4 * token_count
        if buf[pos]:  # shape_components must be null
            return None
        pos += 1
        if (
            buf[pos + 5] < 0x80
            and buf[pos] & buf[pos + 1] & buf[pos + 2] & buf[pos + 3] & buf[pos + 4] & 0x80
        ):
            pos += 6
        else:
            return None
        b = buf[pos]  # output_budget: null, or an int under 8,192
        if b == 0:
            output_budget = None
            pos += 1
        elif b != 2:
            return None
        elif buf[pos + 1] < 0x80:
            b = buf[pos + 1]
            output_budget = (b >> 1) ^ -(b & 1)
            pos += 2
        elif buf[pos + 2] < 0x80:
            b = (buf[pos + 1] & 0x7F) | (buf[pos + 2] << 7)
            output_budget = (b >> 1) ^ -(b & 1)
            pos += 3
        else:
            return None
        if buf[pos]:  # metadata null
            return None
        pos += 1
        if current:
            b = buf[pos]  # request: null, or a valid one
            if b == 0:
                pos += 1
            elif b == 2:
                request, fault, pos = read_final_request(buf, pos + 1)
                if fault is not None:
                    return None
                if request.adapter:
                    model = serving_key(model, request.adapter)
            else:
                return None
        if tail is not None:  # a producer's own fields after ours: checked, then left out
            ours, pos = pos, tail(buf, pos)
        if pos != len(buf):  # nothing after the record
            return None
    except MALFORMED:
        return None
    if tail is not None:  # a view, no copy: the batch splices our part only
        return _new_head(
            ItemHead, (item_id, model, shape, token_count, output_budget, memoryview(buf)[:ours], job)
        )
    return _new_head(ItemHead, (item_id, model, shape, token_count, output_budget, buf, job))


def decode_batch_head(value: bytes | bytearray | memoryview | None) -> BatchHead:
    """A batch checked as :func:`decode_batch` checks it (same reasons: it is tested against
    it), without copying a token or building a record per item.

    For readers that never look at token ids: the audit (which items were dispatched), the demo's
    read-back, the benchmark's simulated consumer. Reading a batch of 1,000-token items this way
    costs about a third of decoding it (docs/wire-format.md).
    """
    value = as_bytes(value)
    current, with_attempts = batch_form(value)
    attempts: list[int] | tuple[()] = ()
    items: list[BatchItemHead] = []
    append = items.append
    problem: tuple[str, str] | None = None  # the first item's that breaks a rule, raised after the structure
    try:
        lead, pos = read_batch_lead(value)
        count, pos = read_block_count(value, pos)
        while count:
            for _ in range(count):
                item_id, job_id, raw_model, pos = read_item_lead(value, pos)
                if job_id:
                    job_id.decode("utf-8")
                shape, pos = read_signature(value, pos)
                token_count, start, end, _parts, _ms, output_budget, _metadata, pos = read_item_rest(
                    value, pos, False
                )
                request, fault, pos = read_request_field(value, pos, False) if current else (None, None, pos)
                model = _model(raw_model)
                append(_new_head(BatchItemHead, (item_id, model, shape, token_count, output_budget, request)))
                if problem is None:
                    problem = _head_problem(item_id, model, token_count, end - start, fault)
            count, pos = read_block_count(value, pos)
        if with_attempts:
            attempts, pos = read_attempts(value, pos, len(items))
    except MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed Batch: {exc}") from None
    finish(value, pos, "Batch")
    if problem is not None:
        raise DecodeError(*problem)
    return BatchHead(*lead, items=items, attempts=attempts or ())
