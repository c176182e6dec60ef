"""Confluent Schema Registry framing: a TokenItem as registry serializers write it, read as our own.

Registry serializers (Java's ``KafkaAvroSerializer``, confluent-kafka's ``AvroSerializer``, Go's
registry clients) write the *Confluent wire format*: a zero magic byte, the writer schema's id as a
4-byte big-endian integer, then the record in plain Avro binary. The writer schema is the
producer's own TokenItem as registered, which may have evolved compatibly (an extra optional field,
a field with a default left out, another namespace). :class:`RegistryFraming` turns such a message
into the single-object encoding the rest of the processor reads (processor/wire/schemas.py):

* a writer schema whose Parsing Canonical Form is one of ours (today's TokenItem or the one before
  ``request``), its named types' namespaces aside, has a byte-identical body, so the message is our
  header plus that body (a copy);
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

from processor.wire.errors import DecodeError
from processor.wire.schemas import HEADERS, NAMESPACE, PARSED, PREVIOUS_TOKEN_ITEM_HEADER, rabin_fingerprint

CONFLUENT_MAGIC = 0
FRAME_SIZE = 5
"""The magic byte and the 4-byte big-endian schema id before the Avro body."""

UNKNOWN_SCHEMA_ID = "unknown-schema-id"
UNRESOLVABLE_SCHEMA = "unresolvable-schema"

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


_Reader = Callable[[bytes], bytes]


class RegistryFraming:
    """Reads registry-framed TokenItems into single-object messages, one reader per schema id."""

    def __init__(self, source: SchemaSource) -> None:
        self._source = source
        self._readers: dict[int, _Reader] = {}

    def single_object(self, value: bytes) -> bytes:
        """The single-object TokenItem that registry-framed ``value`` carries. Raises
        :class:`DecodeError` (``unknown-schema-id``, ``unresolvable-schema``, ``avro-decode``,
        ``trailing-bytes``) or :class:`RegistryUnavailable`."""
        schema_id = int.from_bytes(value[1:FRAME_SIZE], "big")
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._reader(schema_id)
        return reader(value)

    def _reader(self, schema_id: int) -> _Reader:
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
            ours = parse_schema(_in_our_namespace(json.loads(text)))
            fp = rabin_fingerprint(to_parsing_canonical_form(ours).encode()).to_bytes(8, "little")
            header = _OURS.get(fp)
            reader = _splice(header) if header is not None else _resolve(schema_id, writer)
        self._readers[schema_id] = reader
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


def _splice(header: bytes) -> _Reader:
    """Same schema as ours: the body is already ours, byte for byte."""

    def read(value: bytes) -> bytes:
        return header + value[FRAME_SIZE:]

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
