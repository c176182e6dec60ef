"""Completion and CompletionBatch: what consumer apps write to the results topic.

``CompletionBatch`` (one message per batch, the default) is written by hand: splitting one that is
too large for a Kafka message needs each item's exact encoded size (``encode_completion_batches``).
``decode_completions`` reads either form into one list of completions, also messages written
with an earlier schema: before ``cached_tokens`` existed (``COMPLETION_FIELDS_ADDED``: they read with
0 there), before ``CompletionStatus`` gained ``cancelled`` and ``expired`` (``PRE_ENDINGS_*``: the
same fields, three symbols), and before ``attempt`` and ``retriable`` (``PRE_RETRY_*``,
``RETRY_FIELDS_ADDED``: they read as 1 and false; the consumer apps not yet upgraded write these).
An older reader cannot read the current header: upgrade readers (the processor, ``collect``,
``audit``) first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.wire.avro import encode_bytes, encode_int, encode_long, encode_str
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import PreviousSchema, check_ints, fastavro_decode, fastavro_encode
from processor.wire.records import STATUSES, CompletionBatchRecord, CompletionRecord, ItemOutcomeRecord
from processor.wire.registry_framing import results_single_object
from processor.wire.schemas import (
    COMPLETION_BATCH_HEADER,
    HEADER_SIZE,
    MAGIC,
    NAME_BY_FP_BYTES,
    PARSED,
    as_bytes,
    rabin_fingerprint,
    schema_dir,
)


def encode_completion(rec: CompletionRecord) -> bytes:
    if rec.status not in STATUSES:
        raise ValueError(f"completion status {rec.status!r} is not one of {STATUSES}")
    return fastavro_encode("Completion", {name: getattr(rec, name) for name in _COMPLETION_FIELDS})


def decode_completion(value: bytes | bytearray | memoryview | None) -> CompletionRecord:
    """A ``Completion``, also one written with an earlier schema (``PREVIOUS_COMPLETION_HEADER``,
    ``PRE_ENDINGS_COMPLETION_HEADER``)."""
    value = as_bytes(value)
    previous = _EARLIER.get(value[:HEADER_SIZE])
    if previous is not None:
        return CompletionRecord(**previous.decode(value))
    return CompletionRecord(**fastavro_decode(value, "Completion"))


ENDINGS_ADDED = ("cancelled", "expired")
"""The ``CompletionStatus`` symbols appended with job cancel and deadlines (processor/core/endings.py)."""
PRE_ENDINGS_STATUSES = tuple(s for s in STATUSES if s not in ENDINGS_ADDED)
"""The statuses a writer of the schemas before ``ENDINGS_ADDED`` can write."""


class _EarlierStatuses(PreviousSchema):
    """``name``'s schema before it gained the fields in ``added``, and (unless ``endings``) before
    ``CompletionStatus`` gained ``ENDINGS_ADDED``: as :class:`PreviousSchema`, with the enum's first
    symbols only (a writer of that schema never writes the later ones; Avro resolves the rest by
    symbol name)."""

    def __init__(self, name: str, added: tuple[str, ...], endings: bool = False) -> None:
        self.name = name
        raw = json.loads((schema_dir() / f"{name}.avsc").read_text(encoding="utf-8"))
        self.schema = parse_schema(_earlier(raw, frozenset(added), not endings), {}, expand=True)
        fingerprint = rabin_fingerprint(to_parsing_canonical_form(self.schema).encode())
        self.header = MAGIC + fingerprint.to_bytes(8, "little")
        NAME_BY_FP_BYTES[self.header[2:]] = name


def _earlier(schema: Any, added: frozenset[str], drop_endings: bool) -> Any:
    """``schema`` (parsed JSON of a completion record: self-contained) without the fields named in
    ``added``, and (``drop_endings``) with ``ENDINGS_ADDED`` taken out of ``CompletionStatus``,
    wherever they are."""
    if isinstance(schema, list):
        return [_earlier(branch, added, drop_endings) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _earlier(value, added, drop_endings) for key, value in schema.items()}
    if out.get("type") == "record":
        out["fields"] = [f for f in out["fields"] if f["name"] not in added]
    elif drop_endings and out.get("type") == "enum" and out.get("name") == "CompletionStatus":
        out["symbols"] = [s for s in out["symbols"] if s not in ENDINGS_ADDED]
    return out


#: Fields ``Completion`` and ``CompletionBatch`` (in its items) gained with retries in the pipeline.
RETRY_FIELDS_ADDED = ("attempt", "retriable")
#: Fields ``Completion`` and ``CompletionBatch`` (in its items) gained with measured cache use.
COMPLETION_FIELDS_ADDED = ("cached_tokens",)
_BEFORE_CACHE = (*COMPLETION_FIELDS_ADDED, *RETRY_FIELDS_ADDED)
PREVIOUS_COMPLETION: PreviousSchema = _EarlierStatuses("Completion", _BEFORE_CACHE)
PREVIOUS_COMPLETION_BATCH: PreviousSchema = _EarlierStatuses("CompletionBatch", _BEFORE_CACHE)
#: The headers of completions written before ``cached_tokens`` (they read with ``cached_tokens=0``).
PREVIOUS_COMPLETION_HEADER = PREVIOUS_COMPLETION.header
PREVIOUS_COMPLETION_BATCH_HEADER = PREVIOUS_COMPLETION_BATCH.header
PRE_ENDINGS_COMPLETION: PreviousSchema = _EarlierStatuses("Completion", RETRY_FIELDS_ADDED)
PRE_ENDINGS_COMPLETION_BATCH: PreviousSchema = _EarlierStatuses("CompletionBatch", RETRY_FIELDS_ADDED)
#: The headers of completions with ``cached_tokens`` written before ``cancelled`` and ``expired``
#: existed: the same bytes as the ``PRE_RETRY_*`` schema's for the same values, another fingerprint.
PRE_ENDINGS_COMPLETION_HEADER = PRE_ENDINGS_COMPLETION.header
PRE_ENDINGS_COMPLETION_BATCH_HEADER = PRE_ENDINGS_COMPLETION_BATCH.header
PRE_RETRY_COMPLETION: PreviousSchema = _EarlierStatuses("Completion", RETRY_FIELDS_ADDED, endings=True)
PRE_RETRY_COMPLETION_BATCH: PreviousSchema = _EarlierStatuses(
    "CompletionBatch", RETRY_FIELDS_ADDED, endings=True
)
#: The headers of completions with ``cancelled`` and ``expired`` written before ``attempt`` and
#: ``retriable`` existed (they read with attempt 1, not retriable).
PRE_RETRY_COMPLETION_HEADER = PRE_RETRY_COMPLETION.header
PRE_RETRY_COMPLETION_BATCH_HEADER = PRE_RETRY_COMPLETION_BATCH.header
_EARLIER = {p.header: p for p in (PREVIOUS_COMPLETION, PRE_ENDINGS_COMPLETION, PRE_RETRY_COMPLETION)}
_EARLIER_BATCH = {
    p.header: p for p in (PREVIOUS_COMPLETION_BATCH, PRE_ENDINGS_COMPLETION_BATCH, PRE_RETRY_COMPLETION_BATCH)
}
#: Every header a CompletionBatch may carry: the current schema's and each earlier one's (a reader
#: that routes results messages by form tells a batch from a single completion by it).
COMPLETION_BATCH_HEADERS = (COMPLETION_BATCH_HEADER, *_EARLIER_BATCH)


_COMPLETION_FIELDS = tuple(f["name"] for f in PARSED["Completion"]["fields"])

_STATUS_BYTES = {status: encode_long(i) for i, status in enumerate(STATUSES)}


def _outcome_body(o: ItemOutcomeRecord) -> bytes:
    """One ``ItemOutcome`` in Avro binary (hand-written, so a split knows each item's exact size)."""
    status = _STATUS_BYTES.get(o.status)
    if status is None:
        raise ValueError(f"item {o.item_id!r}: completion status {o.status!r} is not one of {STATUSES}")
    return b"".join(
        (
            encode_str(o.item_id),
            status,
            b"\x01" if o.cache_hit else b"\x00",
            encode_int(o.cached_tokens, "cached_tokens"),
            b"\x01" if o.retriable else b"\x00",
            encode_int(o.attempt, "attempt"),
            encode_str(o.job_id),
            b"\x00" if o.reason is None else b"\x02" + encode_str(o.reason),
            encode_int(o.input_tokens, "input_tokens"),
            encode_int(o.output_tokens, "output_tokens"),
            encode_bytes(bytes(o.output)),
            encode_long(o.queued_ms, "queued_ms"),
        )
    )


def _completion_batch_parts(rec: CompletionBatchRecord) -> tuple[bytes, list[bytes]]:
    """The header and batch fields, and each item's body: what every split of ``rec`` is made of."""
    lead = b"".join(
        (
            COMPLETION_BATCH_HEADER,
            encode_str(rec.batch_id),
            encode_str(rec.consumer),
            encode_str(rec.model),
            encode_int(rec.padded_tokens, "padded_tokens"),
            encode_long(rec.engine_ms, "engine_ms"),
            encode_long(rec.completed_ms, "completed_ms"),
        )
    )
    return lead, [_outcome_body(o) for o in rec.items]


def _join_completion_batch(lead: bytes, bodies: Sequence[bytes]) -> bytes:
    if not bodies:
        return lead + b"\x00"
    return b"".join((lead, encode_long(len(bodies)), *bodies, b"\x00"))


def encode_completion_batch(rec: CompletionBatchRecord) -> bytes:
    """One message. Raises ``ValueError`` for a status or number the schema cannot carry."""
    lead, bodies = _completion_batch_parts(rec)
    return _join_completion_batch(lead, bodies)


def encode_completion_batches(rec: CompletionBatchRecord, max_bytes: int) -> list[bytes]:
    """``rec`` as few messages of at most ``max_bytes`` each as its items fit in, items kept in order.

    Each message is a whole ``CompletionBatch`` with ``rec``'s batch fields and a run of its items:
    Kafka refuses a message over the topic's ``max.message.bytes``, and a batch of long outputs can
    be larger than that. An item too large for a message of its own still travels alone (and is
    refused by the broker, which the writer reports).
    """
    lead, bodies = _completion_batch_parts(rec)
    messages: list[bytes] = []
    run: list[bytes] = []
    size = len(lead) + 1  # the array's closing zero
    for body in bodies:
        if run and size + len(body) + len(encode_long(len(run) + 1)) > max_bytes:
            messages.append(_join_completion_batch(lead, run))
            run, size = [], len(lead) + 1
        run.append(body)
        size += len(body)
    messages.append(_join_completion_batch(lead, run))
    return messages


def decode_completion_batch(value: bytes | bytearray | memoryview | None) -> CompletionBatchRecord:
    """A ``CompletionBatch`` (reference decoder, fastavro); the item ints are range-checked too.

    One written before ``cached_tokens`` (``PREVIOUS_COMPLETION_BATCH_HEADER``) reads with 0 there;
    one written before ``cancelled`` and ``expired`` (``PRE_ENDINGS_COMPLETION_BATCH_HEADER``) as it is."""
    value = as_bytes(value)
    previous = _EARLIER_BATCH.get(value[:HEADER_SIZE])
    d = previous.decode(value) if previous is not None else fastavro_decode(value, "CompletionBatch")
    try:
        for o in d["items"]:
            check_ints("ItemOutcome", o)
    except ValueError as exc:
        raise DecodeError("avro-decode", f"malformed CompletionBatch: {exc}") from None
    d["items"] = [ItemOutcomeRecord(**o) for o in d["items"]]
    return CompletionBatchRecord(**d)


def decode_completions(value: bytes | bytearray | memoryview | None) -> list[CompletionRecord]:
    """Every completion a results message holds: a ``Completion`` (one) or a ``CompletionBatch``.

    What every reader of the results topic should call, since consumers write either form (the
    header tells them apart), single-object or registry-framed. Raises :class:`DecodeError` for
    anything else.
    """
    value = results_single_object(as_bytes(value))
    if value[:HEADER_SIZE] == COMPLETION_BATCH_HEADER or value[:HEADER_SIZE] in _EARLIER_BATCH:
        return decode_completion_batch(value).completions()
    return [decode_completion(value)]
