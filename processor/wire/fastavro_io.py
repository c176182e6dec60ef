"""fastavro as the reference codec, and the path for the records that are not hot.

Contracts, ledger snapshots, dead letters and single completions go through fastavro's schemaless
reader and writer, with the int and long ranges checked that fastavro leaves unchecked.
``decode_token_item_fastavro`` is the reference the hand-written item decoder is tested against.

A record's previous writer schema (:class:`PreviousSchema`) is read here too. When a record gains
fields (each with a default), its canonical form and so its fingerprint change; messages already on
the topics, and messages from writers not yet upgraded, carry the old header. ``PreviousSchema``
registers that header (so ``schema_of`` names the record) and resolves a message written with it to
the current schema, Avro filling the new fields' defaults. Readers must be upgraded before writers:
an old reader does not know the new header.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, cast

import fastavro

from processor.core.signature import to_unsigned
from processor.wire.avro import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN
from processor.wire.errors import DecodeError
from processor.wire.items import new_item_record
from processor.wire.records import TokenItemRecord, check_item
from processor.wire.request import request_problem
from processor.wire.request_codec import request_from_avro
from processor.wire.schemas import (
    BATCH_ALL_FIELDS_ADDED,
    BATCH_FIELDS_ADDED,
    HEADER_SIZE,
    HEADERS,
    ITEM_FIELDS_ADDED,
    MAGIC,
    PARSED,
    RECORD_NAMES,
    as_bytes,
    check_header,
    finish,
    previous_schema,
)

# What fastavro (and our int-range checks) raise on a malformed body. Hypothesis tests feed random
# bytes through every decoder to keep this list complete.
FASTAVRO_ERRORS = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError)


# Top-level int and long fields per record, with their ranges: fastavro does not range-check
# them (it writes any Python int as a varint), Java's reader would refuse what does not fit.
_RANGES = {"int": (INT_MIN, INT_MAX), "long": (LONG_MIN, LONG_MAX)}


def _number_fields(schema: Mapping[str, Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((f["name"], *_RANGES[f["type"]]) for f in schema["fields"] if f["type"] in ("int", "long"))


_ITEM_OUTCOME = next(f for f in PARSED["CompletionBatch"]["fields"] if f["name"] == "items")["type"]["items"]

_NUMBER_FIELDS = {name: _number_fields(PARSED[name]) for name in RECORD_NAMES}

_NUMBER_FIELDS["ItemOutcome"] = _number_fields(_ITEM_OUTCOME)


def check_ints(name: str, record: Mapping[str, Any]) -> None:
    for field, low, high in _NUMBER_FIELDS[name]:
        value = record[field]
        if not low <= value <= high:
            raise ValueError(
                f"{name}.{field}={value} does not fit an Avro {'int' if high == INT_MAX else 'long'}"
            )


def fastavro_decode(value: bytes | bytearray | memoryview | None, name: str) -> dict[str, Any]:
    value = as_bytes(value)
    if value[:HEADER_SIZE] != HEADERS[name]:
        check_header(value, name)
    stream = io.BytesIO(value)
    stream.seek(HEADER_SIZE)
    try:
        record = cast(dict[str, Any], fastavro.schemaless_reader(stream, PARSED[name], None, False))
        check_ints(name, record)
    except FASTAVRO_ERRORS as exc:
        raise DecodeError("avro-decode", f"malformed {name}: {type(exc).__name__}: {exc}") from None
    finish(value, stream.tell(), name)
    return record


def decode_with_writers(
    value: bytes | bytearray | memoryview | None, writers: Mapping[bytes, Any], reader: Any, name: str
) -> dict[str, Any]:
    """A single-object message of a record read off the hot path (``Job``, ``JobShare``): read with
    the writer schema its header names, one of ``writers`` (header -> parsed schema: today's and the
    earlier ones still read), resolved to ``reader``. :class:`DecodeError` with the frame's reasons
    (``bad-magic``, ``unknown-schema``, ``avro-decode``, ``trailing-bytes``) for anything else."""
    data = as_bytes(value)
    if len(data) < HEADER_SIZE or data[:2] != MAGIC:
        raise DecodeError("bad-magic", f"not an Avro single-object message (expected tokenfabric.{name})")
    writer = writers.get(data[:HEADER_SIZE])
    if writer is None:
        raise DecodeError(
            "unknown-schema", f"schema fingerprint {data[2:10].hex()} is not tokenfabric.{name}"
        )
    body = io.BytesIO(data)
    body.seek(HEADER_SIZE)
    try:
        record = fastavro.schemaless_reader(body, writer, reader)
    except Exception as exc:  # fastavro raises many types on malformed input
        raise DecodeError("avro-decode", f"tokenfabric.{name}: {exc}") from None
    if body.tell() != len(data):
        raise DecodeError(
            "trailing-bytes", f"tokenfabric.{name}: {len(data) - body.tell()} bytes after the record"
        )
    return cast(dict[str, Any], record)


def fastavro_encode(name: str, record: dict[str, Any]) -> bytes:
    check_ints(name, record)
    stream = io.BytesIO()
    stream.write(HEADERS[name])
    fastavro.schemaless_writer(stream, PARSED[name], record, strict=True)
    return stream.getvalue()


def decode_token_item_fastavro(value: bytes | bytearray | memoryview | None) -> TokenItemRecord:
    """Reference decoder (fastavro): same result and same errors as :func:`decode_token_item`, also
    for a message written before ``request`` (:data:`PREVIOUS_TOKEN_ITEM`)."""
    value = as_bytes(value)
    if value[:HEADER_SIZE] == PREVIOUS_TOKEN_ITEM.header:
        d = PREVIOUS_TOKEN_ITEM.decode(value)
    else:
        d = fastavro_decode(value, "TokenItem")
    components = d["shape_components"]
    budget = d["output_budget"]
    try:
        if budget is not None and not INT_MIN <= budget <= INT_MAX:
            raise ValueError(f"output_budget={budget} out of int range")
        request = request_from_avro(d["request"])
    except ValueError as exc:
        raise DecodeError("avro-decode", f"malformed TokenItem: {exc}") from None
    rec = new_item_record(
        d["item_id"],
        d["job_id"],
        d["model"],
        to_unsigned(d["shape"]),
        d["token_count"],
        d["tokens"],
        None if components is None else tuple(components),
        d["produced_ms"],
        budget,
        d["metadata"],
        request,
    )
    check_item(rec, None if request is None else request_problem(request))
    return rec


class PreviousSchema:
    """``name``'s schema before it gained the fields named in ``added``.

    A name in ``added`` is removed from every record of the schema, nested ones included
    (``CompletionBatch`` gained ``cached_tokens`` in its ``ItemOutcome`` items, ``Batch`` gained
    ``request`` in its ``TokenItem`` items), so the names must be new everywhere in the record
    (:func:`processor.wire.schemas.previous_schema`).
    """

    def __init__(self, name: str, added: tuple[str, ...]) -> None:
        self.name = name
        self.schema, self.header = previous_schema(name, added)

    def decode(self, value: bytes) -> dict[str, Any]:
        """The record in ``value`` (whose header is :attr:`header`) as the current schema reads it."""
        stream = io.BytesIO(value)
        stream.seek(HEADER_SIZE)
        try:
            reader = PARSED[self.name]
            record = cast(dict[str, Any], fastavro.schemaless_reader(stream, self.schema, reader, False))
            check_ints(self.name, record)
        except FASTAVRO_ERRORS as exc:
            raise DecodeError("avro-decode", f"malformed {self.name}: {type(exc).__name__}: {exc}") from None
        finish(value, stream.tell(), self.name)
        return record

    def encode(self, record: dict[str, Any]) -> bytes:
        """``record`` written with the previous schema, as a writer not yet upgraded writes it (tests,
        golden messages); fields the previous schema lacks are ignored."""
        stream = io.BytesIO()
        stream.write(self.header)
        fastavro.schemaless_writer(stream, self.schema, record)
        return stream.getvalue()


#: TokenItem and Batch before ``request`` (``ITEM_FIELDS_ADDED``): they read with no request.
PREVIOUS_TOKEN_ITEM = PreviousSchema("TokenItem", ITEM_FIELDS_ADDED)
PREVIOUS_BATCH = PreviousSchema("Batch", BATCH_ALL_FIELDS_ADDED)
#: Batch before ``attempts`` (``BATCH_FIELDS_ADDED``): every item on its first attempt.
PRE_ATTEMPTS_BATCH = PreviousSchema("Batch", BATCH_FIELDS_ADDED)
