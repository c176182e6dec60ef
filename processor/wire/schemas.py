"""The schemas, their fingerprints and the single-object header every message starts with.

Every message is Avro *single-object encoding* (Avro spec, "Single object encoding"): the two bytes
``C3 01``, the 8-byte little-endian CRC-64-AVRO (Rabin) fingerprint of the writer schema's Parsing
Canonical Form, then the record in plain Avro binary. Any language's Avro library can write it
(Java's ``BinaryMessageEncoder``, Go's goavro ``SingleFromNative``), and the fingerprint tells a
reader which of our schemas a message claims to be without a schema registry. See
docs/wire-format.md for the schemas field by field. The ``.avsc`` files ship in ``avsc/`` beside
this module (byte-identical to the repository's ``schemas/``, which a test checks).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.wire.errors import DecodeError

NAMESPACE = "tokenfabric"


#: Record names in load order: Batch refers to TokenItem by name, so TokenItem comes first.
RECORD_NAMES = (
    "TokenItem", "Batch", "Completion", "CompletionBatch", "ConsumerContract", "LedgerSnapshot", "DeadLetter",
)  # fmt: skip

MAGIC = b"\xc3\x01"

HEADER_SIZE = 10
FRAME_SIZE = 5
"""The Confluent wire format's magic byte (0) and 4-byte big-endian schema id before the Avro body
(processor/wire/registry_framing.py)."""


def rabin_fingerprint(data: bytes) -> int:
    """CRC-64-AVRO of ``data`` as an unsigned 64-bit integer (the Avro spec's reference algorithm)."""
    fp = _RABIN_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _RABIN_TABLE[(fp ^ byte) & 0xFF]
    return fp


def _rabin_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_RABIN_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_RABIN_EMPTY = 0xC15D213AA4D7A795

_RABIN_TABLE = _rabin_table()


def schema_dir() -> Path:
    """Where the .avsc files are read from.

    The packaged copy (``processor/wire/avsc``) wins so an installed wheel works; a source
    checkout without it falls back to the repository's ``schemas/``. A test keeps both identical.
    """
    packaged = Path(__file__).resolve().with_name("avsc")
    if (packaged / "TokenItem.avsc").is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "schemas"


def _load_schemas(added: frozenset[str] = frozenset()) -> tuple[dict[str, Any], dict[str, str]]:
    """Every record's parsed (expanded) schema and canonical form, without the fields named in
    ``added`` (none: the current schemas; see :func:`previous_schema`)."""
    named: dict[str, Any] = {}
    parsed: dict[str, Any] = {}
    canonical: dict[str, str] = {}
    folder = schema_dir()
    for name in RECORD_NAMES:
        raw = json.loads((folder / f"{name}.avsc").read_text(encoding="utf-8"))
        # expand=True inlines TokenItem into Batch, as the canonical form requires.
        schema = parse_schema(without_fields(raw, added), named, expand=True)
        parsed[name] = schema
        canonical[name] = to_parsing_canonical_form(schema)
    return parsed, canonical


def without_fields(schema: Any, added: frozenset[str]) -> Any:
    """``schema`` (parsed JSON) with the fields named in ``added`` removed from every record in it."""
    if not added:
        return schema
    if isinstance(schema, list):
        return [without_fields(branch, added) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("type") == "record":
        out["fields"] = [
            {**f, "type": without_fields(f["type"], added)} for f in out["fields"] if f["name"] not in added
        ]
    elif out.get("type") == "array":
        out["items"] = without_fields(out["items"], added)
    elif out.get("type") == "map":
        out["values"] = without_fields(out["values"], added)
    elif isinstance(out.get("type"), (dict, list)):
        out["type"] = without_fields(out["type"], added)
    return out


PARSED, CANONICAL_FORMS = _load_schemas()


#: Unsigned CRC-64-AVRO fingerprint of each record's Parsing Canonical Form, by short name.
FINGERPRINTS: dict[str, int] = {n: rabin_fingerprint(CANONICAL_FORMS[n].encode()) for n in RECORD_NAMES}


#: The 10-byte single-object header of each record, by short name.
HEADERS: dict[str, bytes] = {n: MAGIC + FINGERPRINTS[n].to_bytes(8, "little") for n in RECORD_NAMES}

NAME_BY_FP_BYTES = {h[2:]: n for n, h in HEADERS.items()}

TOKEN_ITEM_HEADER = HEADERS["TokenItem"]

BATCH_HEADER = HEADERS["Batch"]

COMPLETION_BATCH_HEADER = HEADERS["CompletionBatch"]


@functools.cache
def previous_schema(name: str, added: tuple[str, ...]) -> tuple[Any, bytes]:
    """``name``'s parsed schema before it gained the fields named in ``added``, and its header,
    which :func:`schema_of` then names ``name`` (:class:`processor.wire.fastavro_io.PreviousSchema`
    reads such messages).

    The fields are removed from every record, the records ``name`` refers to included: ``Batch``
    inlines ``TokenItem``, so when TokenItem gained ``request`` Batch's fingerprint changed too, and
    the previous Batch is the one whose items lack it. The names must be new everywhere.
    """
    parsed, canonical = _load_schemas(frozenset(added))
    header = MAGIC + rabin_fingerprint(canonical[name].encode()).to_bytes(8, "little")
    NAME_BY_FP_BYTES[header[2:]] = name
    return parsed[name], header


#: Fields ``TokenItem`` gained (and ``Batch`` with it, in its items) with per-item requests.
ITEM_FIELDS_ADDED = ("request",)
#: The field ``Batch`` gained with retries inside the pipeline (each item's attempt).
BATCH_FIELDS_ADDED = ("attempts",)
#: Every field ``Batch`` gained since its first version, its items' included.
BATCH_ALL_FIELDS_ADDED = (*ITEM_FIELDS_ADDED, *BATCH_FIELDS_ADDED)

#: The headers of a TokenItem and a Batch written before ``request``: they read with no request
#: (and a Batch with every item on its first attempt).
PREVIOUS_TOKEN_ITEM_HEADER = previous_schema("TokenItem", ITEM_FIELDS_ADDED)[1]
PREVIOUS_BATCH_HEADER = previous_schema("Batch", BATCH_ALL_FIELDS_ADDED)[1]
#: The header of a Batch written before ``attempts``: the processor still writes it for a batch whose
#: items are all on their first attempt (the same bytes as before), so that consumer apps not yet
#: upgraded read every batch until a retry happens. It reads with ``attempts`` empty.
PRE_ATTEMPTS_BATCH_HEADER = previous_schema("Batch", BATCH_FIELDS_ADDED)[1]


def fastavro_fingerprint(name: str) -> int:
    """fastavro's own CRC-64-AVRO of a record's canonical form (a cross-check for the tests)."""
    hex_le = _fastavro_fingerprint(CANONICAL_FORMS[name], "CRC-64-AVRO")
    return int.from_bytes(bytes.fromhex(hex_le), "little")


def parsed_schema(name: str) -> Any:
    """The fastavro-parsed (expanded) schema of a record, by short name."""
    return PARSED[name]


def schema_of(value: bytes | bytearray | memoryview | None) -> str:
    """Short record name a message's header claims, without decoding the body."""
    view = as_bytes(value)
    if len(view) < HEADER_SIZE or view[:2] != MAGIC:
        raise DecodeError("bad-magic", "not an Avro single-object message (no C3 01 header)")
    name = NAME_BY_FP_BYTES.get(view[2:HEADER_SIZE])
    if name is None:
        raise DecodeError("unknown-schema", f"unknown schema fingerprint {view[2:HEADER_SIZE].hex()}")
    return name


def as_bytes(value: bytes | bytearray | memoryview | None) -> bytes:
    if type(value) is bytes:
        return value
    if value is None:
        return b""
    return bytes(value)


def check_header(value: bytes, name: str) -> None:
    if len(value) < HEADER_SIZE or value[:2] != MAGIC:
        raise DecodeError(
            "bad-magic", f"not an Avro single-object message (expected {name}, no C3 01 header)"
        )
    other = NAME_BY_FP_BYTES.get(value[2:HEADER_SIZE])
    if other is None:
        raise DecodeError("unknown-schema", f"unknown schema fingerprint {value[2:HEADER_SIZE].hex()}")
    raise DecodeError("unknown-schema", f"message is a {NAMESPACE}.{other}, expected {NAMESPACE}.{name}")


def finish(value: bytes, pos: int, name: str) -> None:
    if pos != len(value):
        raise DecodeError("trailing-bytes", f"{len(value) - pos} bytes after the end of the {name} record")
