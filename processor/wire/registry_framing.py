"""Confluent Schema Registry framing: a TokenItem as registry serializers write it, read as our own.

Registry serializers (Java's ``KafkaAvroSerializer``, confluent-kafka's ``AvroSerializer``, Go's
registry clients) write the *Confluent wire format*: a zero magic byte, the writer schema's id as a
4-byte big-endian integer, then the record in plain Avro binary. The writer schema is the
producer's own TokenItem as registered, which may have evolved compatibly (an extra optional field,
a field with a default left out, another namespace). :class:`RegistryFraming` turns such a message
into the single-object encoding the rest of the processor reads (processor/wire/schemas.py):

* a writer schema whose Parsing Canonical Form is one of ours (today's TokenItem or the one before
  ``request``), its named types' namespaces aside, has a byte-identical body, so the message is our
  header plus that body (a copy); :meth:`RegistryFraming.head`, the intake's call, reads today's in
  place instead (``heads.framed_item_head``: no copy, the batch splices past the frame);
* one that is today's TokenItem followed by fields of the producer's own (the usual evolution: an
  extra optional field) starts with our body: our record is walked to its end (no copy of a field),
  the producer's fields after it are checked (by processor/wire/skips.py when they are simple: the
  head then keeps a view of the message up to our record's end; else with fastavro, our part kept);
* any other is read with Avro's schema resolution (fastavro: writer schema -> TokenItem) and
  written again as today's TokenItem, whose own checks then apply as for any item.

The registry lookup is the :class:`SchemaSource` passed in (processor/kafka/schema_registry.py talks
HTTP): this module does no I/O. Invariants: each schema id is looked up once while it is known
(its reader is cached; an unknown id is asked again, it costs only bad input); an id the registry
does not know raises ``DecodeError("unknown-schema-id")``, a writer schema that cannot be resolved
against TokenItem ``DecodeError("unresolvable-schema")`` (both dead-lettered by the caller); a
registry that does not answer raises :class:`RegistryUnavailable`, which is never bad input: the
caller holds the message and asks again later.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any, Protocol

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.schema import SchemaParseException, UnknownType, parse_schema, to_parsing_canonical_form

from processor.wire.avro import read_signature
from processor.wire.errors import MALFORMED, REGISTRY_REASONS, DecodeError
from processor.wire.heads import ItemHead, decode_item_head, framed_head_reader, framed_item_head
from processor.wire.items import read_item_lead, read_item_rest
from processor.wire.request_codec import read_request_field
from processor.wire.schemas import (
    FRAME_SIZE,
    HEADERS,
    NAMESPACE,
    PARSED,
    PREVIOUS_TOKEN_ITEM_HEADER,
    rabin_fingerprint,
)
from processor.wire.skips import fields_skipper as _fields_skipper

CONFLUENT_MAGIC = 0

UNKNOWN_SCHEMA_ID, UNRESOLVABLE_SCHEMA = REGISTRY_REASONS

_OURS = {h[2:]: h for h in (HEADERS["TokenItem"], PREVIOUS_TOKEN_ITEM_HEADER)}
"""Fingerprint bytes -> our 10-byte header, for writer schemas identical to one of ours."""


class RegistryUnavailable(Exception):
    """The registry did not answer (refused, timed out, a 5xx): an outage, not bad input."""


class SchemaSource(Protocol):
    """Where writer schemas come from (a registry client, or a dict in tests)."""

    def schema_text(self, schema_id: int) -> str | None:
        """The Avro schema JSON registered under ``schema_id``; None if the registry does not know
        the id. Raises :class:`RegistryUnavailable` if it cannot tell."""
        ...


def decode_ingest_head(
    value: bytes | bytearray | memoryview | None, framing: RegistryFraming | None
) -> ItemHead:
    """An ingest message's head in either framing: single-object as ever, and a registry-framed one
    through ``framing`` (None: none configured, so it is refused ``bad-magic`` as before)."""
    if framing is not None and type(value) is bytes and value[:1] == b"\0":
        return framing.head(value)
    return decode_item_head(value)


def is_registry_framed(value: bytes) -> bool:
    """Whether ``value`` starts as the Confluent wire format does (never true of single-object,
    whose first byte is ``C3``)."""
    return len(value) >= FRAME_SIZE and value[0] == CONFLUENT_MAGIC


def frame(schema_id: int, body: bytes) -> bytes:
    """``body`` (plain Avro binary) in the Confluent wire format under ``schema_id``."""
    return bytes((CONFLUENT_MAGIC,)) + schema_id.to_bytes(4, "big") + body


def frame_single_object(schema_id: int, message: bytes) -> bytes:
    """A single-object message of ours re-framed for a registry reader: same body, ``schema_id``
    being our schema's id in that registry."""
    return frame(schema_id, message[len(PREVIOUS_TOKEN_ITEM_HEADER) :])


def results_single_object(value: bytes) -> bytes:
    """A results message as single-object: a registry-framed one (what a consumer with
    ``--completions registry`` writes) is this version's ``CompletionBatch`` under its registered id,
    so its body follows our header; any other is returned as it is. Invariant: only tokenfabric
    writes the results topic, and its readers are upgraded before its writers (as for every schema
    change), so a framed results message never carries a schema the reader does not know."""
    if value[:1] == b"\0" and len(value) >= FRAME_SIZE:
        return HEADERS["CompletionBatch"] + memoryview(value)[FRAME_SIZE:]
    return value


_Reader = Callable[[bytes], bytes]


class RegistryFraming:
    """Reads registry-framed TokenItems into single-object messages, one reader per schema id."""

    def __init__(self, source: SchemaSource) -> None:
        self._source = source
        self._readers: dict[bytes, _Reader] = {}
        self._heads: dict[bytes, Callable[[bytes], ItemHead | None]] = {}
        """Ids (their 4 bytes) whose items' heads are read in place: a writer schema that is today's
        TokenItem (any namespace), maybe followed by simple fields of the producer's own."""

    def head(self, value: bytes) -> ItemHead:
        """The head of registry-framed ``value``: read in place, no copy, when its writer schema is
        today's TokenItem and the item is encoded the usual way (``heads.framed_item_head``: the
        head keeps the framed message); else read from its single-object form. Raises as
        :meth:`single_object` and :func:`decode_item_head` do."""
        raw_id = value[1:FRAME_SIZE]
        read = self._heads.get(raw_id)
        if read is None and raw_id not in self._readers:  # an id not seen yet: its schema first
            self._reader(raw_id)
            read = self._heads.get(raw_id)
        if read is not None:
            head = read(value)
            if head is not None:
                return head
        return decode_item_head(self.single_object(value))

    def single_object(self, value: bytes) -> bytes:
        """The single-object TokenItem that registry-framed ``value`` carries. Raises
        :class:`DecodeError` (``unknown-schema-id``, ``unresolvable-schema``, ``avro-decode``,
        ``trailing-bytes``) or :class:`RegistryUnavailable`."""
        reader = self._readers.get(value[1:FRAME_SIZE])  # keyed by the id's 4 bytes: no int built
        if reader is None:
            reader = self._reader(value[1:FRAME_SIZE])
        return reader(value)

    def _reader(self, raw_id: bytes) -> _Reader:
        schema_id = int.from_bytes(raw_id, "big")
        text = self._source.schema_text(schema_id)
        if text is None:
            raise DecodeError(UNKNOWN_SCHEMA_ID, f"schema id {schema_id} is not in the schema registry")
        try:
            writer = parse_schema(json.loads(text))
        except (ValueError, SchemaParseException, UnknownType) as exc:
            raise DecodeError(
                UNRESOLVABLE_SCHEMA, f"schema id {schema_id} is not an Avro schema: {exc}"
            ) from None
        if not isinstance(writer, dict) or writer.get("type") != "record":
            reader: _Reader = _refuse(schema_id, "is not an Avro record schema")
        else:
            moved = _in_our_namespace(json.loads(text))
            header = _OURS.get(_fingerprint(moved))
            if header is not None:
                reader = _splice(header)
                if header == HEADERS["TokenItem"]:
                    self._heads[raw_id] = framed_item_head
            else:
                theirs = _their_fields(moved)
                reader = _resolve(schema_id, writer) if theirs is None else _prefixed(schema_id, theirs)
                skip = None if theirs is None else _fields_skipper(theirs)
                if skip is not None:
                    self._heads[raw_id] = framed_head_reader(skip)
        self._readers[raw_id] = reader
        return reader


def _in_our_namespace(schema: Any) -> Any:
    """``schema`` (JSON) with every named type moved to our namespace: names do not change the
    binary encoding, so a producer's TokenItem in its own namespace splices as ours."""
    if isinstance(schema, list):
        return [_in_our_namespace(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k == "default" else _in_our_namespace(v) for k, v in schema.items() if k != "namespace"}
    if out.get("type") in ("record", "enum", "fixed") and isinstance(out.get("name"), str):
        out["name"] = f"{NAMESPACE}.{out['name'].rsplit('.', 1)[-1]}"
    return out


def _fingerprint(schema: Any) -> bytes:
    return rabin_fingerprint(to_parsing_canonical_form(parse_schema(schema)).encode()).to_bytes(8, "little")


def _their_fields(moved: dict[str, Any]) -> list[Any] | None:
    """The producer's own fields when ``moved`` is today's TokenItem and then those; else None."""
    ours = len(PARSED["TokenItem"]["fields"])
    fields = moved.get("fields")
    if not isinstance(fields, list) or len(fields) <= ours:
        return None
    if _fingerprint({**moved, "fields": fields[:ours]}) != HEADERS["TokenItem"][2:]:
        return None
    return fields[ours:]


def _prefixed(schema_id: int, fields: list[Any]) -> _Reader:
    """Today's TokenItem and then ``fields`` of the producer's own: our part kept, theirs checked."""
    theirs = parse_schema({"type": "record", "name": f"{NAMESPACE}.TheirFields", "fields": fields})
    header = HEADERS["TokenItem"]

    def read(value: bytes) -> bytes:
        try:
            _item_id, _job, _model, pos = read_item_lead(value, FRAME_SIZE)
            _shape, pos = read_signature(value, pos)
            pos = read_item_rest(value, pos, False)[-1]
            pos = read_request_field(value, pos, False)[-1]
        except MALFORMED as exc:
            raise DecodeError("avro-decode", f"malformed TokenItem (schema id {schema_id}): {exc}") from None
        stream = io.BytesIO(value)
        stream.seek(pos)
        try:
            fastavro.schemaless_reader(stream, theirs, None)
        except Exception as exc:  # fastavro raises many types on a malformed body
            raise DecodeError("avro-decode", f"malformed TokenItem (schema id {schema_id}): {exc}") from None
        if stream.tell() != len(value):
            raise DecodeError(
                "trailing-bytes", f"{len(value) - stream.tell()} bytes after the end of the TokenItem record"
            )
        return header + memoryview(value)[FRAME_SIZE:pos]

    return read


def _splice(header: bytes) -> _Reader:
    """Same schema as ours: the body is already ours, byte for byte."""

    def read(value: bytes) -> bytes:
        return header + memoryview(value)[FRAME_SIZE:]  # one copy, not a slice and then a join

    return read


def _refuse(schema_id: int, why: str) -> _Reader:
    def read(value: bytes) -> bytes:
        raise DecodeError(UNRESOLVABLE_SCHEMA, f"schema id {schema_id} {why}")

    return read


def _resolve(schema_id: int, writer: Any) -> _Reader:
    """A producer's own TokenItem: Avro resolution to ours, then written as ours."""
    reader_schema = PARSED["TokenItem"]
    header = HEADERS["TokenItem"]

    def read(value: bytes) -> bytes:
        stream = io.BytesIO(value)
        stream.seek(FRAME_SIZE)
        try:
            record = fastavro.schemaless_reader(stream, writer, reader_schema)
        except SchemaResolutionError as exc:
            raise DecodeError(
                UNRESOLVABLE_SCHEMA, f"schema id {schema_id} cannot be read as tokenfabric.TokenItem: {exc}"
            ) from None
        except Exception as exc:  # fastavro raises many types on a malformed body
            raise DecodeError("avro-decode", f"malformed TokenItem (schema id {schema_id}): {exc}") from None
        if stream.tell() != len(value):
            raise DecodeError(
                "trailing-bytes", f"{len(value) - stream.tell()} bytes after the end of the TokenItem record"
            )
        out = io.BytesIO()
        out.write(header)
        try:
            fastavro.schemaless_writer(out, reader_schema, record, strict=True)
        except (ValueError, TypeError) as exc:
            raise DecodeError("avro-decode", f"TokenItem (schema id {schema_id}): {exc}") from None
        return out.getvalue()

    return read
