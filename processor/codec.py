"""The wire format: the only module that turns Kafka message bytes into Python values and back.

Every message is Avro *single-object encoding* (Avro spec, "Single object encoding"): the two bytes
``C3 01``, the 8-byte little-endian CRC-64-AVRO (Rabin) fingerprint of the writer schema's Parsing
Canonical Form, then the record in plain Avro binary. Any language's Avro library can write it
(Java's ``BinaryMessageEncoder``, Go's goavro ``SingleFromNative``), and the fingerprint tells a
reader which of our schemas a message claims to be without a schema registry. See
docs/wire-format.md for the schemas field by field.

Why two decoders for ``TokenItem``: it is the processor's hot path (every input message), and a
hand-written decoder for its fixed field layout is measured faster than fastavro's generic
``schemaless_reader`` (numbers in docs/wire-format.md, ``benchmarks/bench_codec.py`` reproduces
them), and stricter where fastavro is laxer than the spec. The fastavro path is kept as the
reference: the tests check that both give the same record or the same error on generated input
(except that fastavro accepts over-long varints and negative union indexes), and that the
hand-written encoder writes the same bytes as fastavro's writer.
Batches reuse the same hand-written item code. The other records are not hot and go through
fastavro, except that ``CompletionBatch`` is written by hand too: splitting one that is too large
for a Kafka message needs each item's exact encoded size.

Decoding is a trust boundary: anything that is not a well-formed message of the expected schema
raises :class:`DecodeError` (and nothing else), with a short ``reason`` fit for a dead-letter record
or a metric label. Encoders refuse, with ``ValueError``, what the decoders would reject.
"""

from __future__ import annotations

import io
import json
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast

import fastavro
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.contract import Contract
from processor.item import Batch
from processor.signature import shape_signature, to_signed, to_unsigned

# --------------------------------------------------------------------------------------------------
# Errors


class DecodeError(ValueError):
    """A message that is not a valid record of the expected schema.

    ``reason`` is short and stable (``bad-magic``, ``unknown-schema``, ``avro-decode``,
    ``trailing-bytes``, ``negative-token-count``, ``token-count-mismatch``, ``empty-model``,
    ``empty-item-id``, ``invalid-contract``); the message says what exactly was wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))


# --------------------------------------------------------------------------------------------------
# Schemas, fingerprints, headers

NAMESPACE = "tokenfabric"
#: Record names in load order: Batch refers to TokenItem by name, so TokenItem comes first.
RECORD_NAMES = (
    "TokenItem", "Batch", "Completion", "CompletionBatch", "ConsumerContract", "LedgerSnapshot", "DeadLetter",
)  # fmt: skip
MAGIC = b"\xc3\x01"
HEADER_SIZE = 10

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


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

    The packaged copy (``processor/data/schemas``) wins so an installed wheel works; a source
    checkout without it falls back to the repository's ``schemas/``. A test keeps both identical.
    """
    packaged = Path(str(resources.files("processor"))) / "data" / "schemas"
    if (packaged / "TokenItem.avsc").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "schemas"


def _load_schemas() -> tuple[dict[str, Any], dict[str, str]]:
    named: dict[str, Any] = {}
    parsed: dict[str, Any] = {}
    canonical: dict[str, str] = {}
    folder = schema_dir()
    for name in RECORD_NAMES:
        raw = json.loads((folder / f"{name}.avsc").read_text(encoding="utf-8"))
        # expand=True inlines TokenItem into Batch, as the canonical form requires.
        schema = parse_schema(raw, named, expand=True)
        parsed[name] = schema
        canonical[name] = to_parsing_canonical_form(schema)
    return parsed, canonical


_PARSED, CANONICAL_FORMS = _load_schemas()
#: Unsigned CRC-64-AVRO fingerprint of each record's Parsing Canonical Form, by short name.
FINGERPRINTS: dict[str, int] = {n: rabin_fingerprint(CANONICAL_FORMS[n].encode()) for n in RECORD_NAMES}
#: The 10-byte single-object header of each record, by short name.
HEADERS: dict[str, bytes] = {n: MAGIC + FINGERPRINTS[n].to_bytes(8, "little") for n in RECORD_NAMES}
_NAME_BY_FP_BYTES = {h[2:]: n for n, h in HEADERS.items()}

_TOKEN_ITEM_HEADER = HEADERS["TokenItem"]
_BATCH_HEADER = HEADERS["Batch"]
_COMPLETION_BATCH_HEADER = HEADERS["CompletionBatch"]


def fastavro_fingerprint(name: str) -> int:
    """fastavro's own CRC-64-AVRO of a record's canonical form (a cross-check for the tests)."""
    hex_le = _fastavro_fingerprint(CANONICAL_FORMS[name], "CRC-64-AVRO")
    return int.from_bytes(bytes.fromhex(hex_le), "little")


def parsed_schema(name: str) -> Any:
    """The fastavro-parsed (expanded) schema of a record, by short name."""
    return _PARSED[name]


def schema_of(value: bytes | bytearray | memoryview | None) -> str:
    """Short record name a message's header claims, without decoding the body."""
    view = _as_bytes(value)
    if len(view) < HEADER_SIZE or view[:2] != MAGIC:
        raise DecodeError("bad-magic", "not an Avro single-object message (no C3 01 header)")
    name = _NAME_BY_FP_BYTES.get(view[2:HEADER_SIZE])
    if name is None:
        raise DecodeError("unknown-schema", f"unknown schema fingerprint {view[2:HEADER_SIZE].hex()}")
    return name


def _as_bytes(value: bytes | bytearray | memoryview | None) -> bytes:
    if type(value) is bytes:
        return value
    if value is None:
        return b""
    return bytes(value)


def _check_header(value: bytes, name: str) -> None:
    if len(value) < HEADER_SIZE or value[:2] != MAGIC:
        raise DecodeError(
            "bad-magic", f"not an Avro single-object message (expected {name}, no C3 01 header)"
        )
    other = _NAME_BY_FP_BYTES.get(value[2:HEADER_SIZE])
    if other is None:
        raise DecodeError("unknown-schema", f"unknown schema fingerprint {value[2:HEADER_SIZE].hex()}")
    raise DecodeError("unknown-schema", f"message is a {NAMESPACE}.{other}, expected {NAMESPACE}.{name}")


# --------------------------------------------------------------------------------------------------
# Token ids

_U32 = next(code for code in "IL" if array(code).itemsize == 4)
_BIG_ENDIAN = sys.byteorder == "big"


def tokens_from_ids(ids: Iterable[int]) -> bytes:
    """Pack token ids as little-endian uint32 (the ``tokens`` field)."""
    try:
        packed = array(_U32, ids)
    except OverflowError as exc:
        raise ValueError(f"token id out of uint32 range: {exc}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def ids_from_tokens(tokens: bytes | bytearray | memoryview) -> array[int]:
    """Unpack the ``tokens`` field into an ``array('I')`` of token ids."""
    ids = array(_U32)
    ids.frombytes(tokens)  # ValueError unless a multiple of 4 bytes
    if _BIG_ENDIAN:
        ids.byteswap()
    return ids


# --------------------------------------------------------------------------------------------------
# Records at the boundary


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenItemRecord:
    """A decoded ``TokenItem``. ``shape`` is the unsigned signature; ``tokens`` stays packed."""

    item_id: str
    job_id: str = ""
    model: str
    shape: int
    token_count: int
    tokens: bytes
    shape_components: tuple[str, ...] | None = None
    produced_ms: int
    output_budget: int | None = None
    metadata: dict[str, str] | None = None

    def token_ids(self) -> array[int]:
        return ids_from_tokens(self.tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """A decoded ``Batch`` (what a consumer reads). ``shape`` is unsigned."""

    batch_id: str
    consumer: str
    model: str
    shape: int
    lane: int
    padded_length: int
    pad_multiple: int
    created_ms: int
    oversized: bool = False
    items: list[TokenItemRecord]


Status = Literal["ok", "failed", "rejected"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "rejected")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRecord:
    """The outcome of one item. ``padded_tokens`` is the item's share: its batch's padded length."""

    item_id: str
    job_id: str = ""
    batch_id: str = ""
    consumer: str = ""
    model: str
    status: Status
    reason: str | None = None
    input_tokens: int
    output_tokens: int = 0
    padded_tokens: int = 0
    output: bytes = b""
    queued_ms: int = 0
    engine_ms: int = 0
    completed_ms: int
    cache_hit: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemOutcomeRecord:
    """One item's part of a :class:`CompletionBatchRecord`: a Completion less the batch's fields."""

    item_id: str
    status: Status
    cache_hit: bool = False
    job_id: str = ""
    reason: str | None = None
    input_tokens: int
    output_tokens: int = 0
    output: bytes = b""
    queued_ms: int = 0


#: How a consumer writes a batch's completions: one ``CompletionBatch`` message per batch (split only
#: when too large for one Kafka message), or one ``Completion`` message per item.
CompletionForm = Literal["batch", "item"]
COMPLETION_FORMS: tuple[CompletionForm, ...] = ("batch", "item")

#: The fields a batch's completions share, written once in a ``CompletionBatch``.
BATCH_COMPLETION_FIELDS = ("batch_id", "consumer", "model", "padded_tokens", "engine_ms", "completed_ms")
_OUTCOME_FIELDS = tuple(f.name for f in fields(ItemOutcomeRecord))


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionBatchRecord:
    """The outcomes of (some of) one batch's items: one message instead of one per item.

    It says exactly what :meth:`completions` says; a batch's shared fields are written once.
    """

    batch_id: str
    consumer: str
    model: str
    padded_tokens: int = 0
    engine_ms: int = 0
    completed_ms: int
    items: list[ItemOutcomeRecord]

    @classmethod
    def of(cls, completions: Sequence[CompletionRecord]) -> CompletionBatchRecord:
        """The batch form of one batch's completions; ``ValueError`` unless they share the batch's fields."""
        if not completions:
            raise ValueError("a CompletionBatch needs at least one completion to take its batch fields from")
        first = completions[0]
        shared = {name: getattr(first, name) for name in BATCH_COMPLETION_FIELDS}
        for c in completions:
            other = next((n for n in BATCH_COMPLETION_FIELDS if getattr(c, n) != shared[n]), None)
            if other is not None:
                raise ValueError(
                    f"completion {c.item_id!r}: {other}={getattr(c, other)!r}, "
                    f"its batch's first completion has {shared[other]!r}"
                )
        items = [ItemOutcomeRecord(**{n: getattr(c, n) for n in _OUTCOME_FIELDS}) for c in completions]
        return cls(**shared, items=items)

    def completions(self) -> list[CompletionRecord]:
        """One :class:`CompletionRecord` per item, the batch's fields copied into each."""
        shared = {name: getattr(self, name) for name in BATCH_COMPLETION_FIELDS}
        return [CompletionRecord(**shared, **{n: getattr(o, n) for n in _OUTCOME_FIELDS}) for o in self.items]


@dataclass(frozen=True, slots=True)
class ContractRecord:
    """A consumer's announcement: its :class:`Contract` and when it was made."""

    contract: Contract
    announced_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerSnapshotRecord:
    instance: str
    taken_ms: int
    sequence: int
    counters: dict[str, int]
    per_model: dict[str, dict[str, int]]
    per_consumer: dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterRecord:
    reason: str
    source_topic: str
    partition: int
    offset: int
    original: bytes
    original_key: bytes | None = None
    dead_ms: int


def new_token_item(
    item_id: str,
    model: str,
    token_ids: Sequence[int],
    produced_ms: int,
    *,
    job_id: str = "",
    shape_components: Sequence[str] | None = None,
    shape: int | None = None,
    output_budget: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> TokenItemRecord:
    """Build a record the way a producer would: shape from the components unless given."""
    if shape is None:
        shape = shape_signature(shape_components or ())
    return TokenItemRecord(
        item_id=item_id,
        job_id=job_id,
        model=model,
        shape=shape,
        token_count=len(token_ids),
        tokens=tokens_from_ids(token_ids),
        shape_components=None if shape_components is None else tuple(shape_components),
        produced_ms=produced_ms,
        output_budget=output_budget,
        metadata=None if metadata is None else dict(metadata),
    )


def verify_shape(rec: TokenItemRecord) -> bool | None:
    """Whether ``shape`` matches ``shape_components`` (None when no components were sent).

    Not done on decode: the shape is the producer's claim and the hot path trusts it.
    """
    if rec.shape_components is None:
        return None
    return shape_signature(rec.shape_components) == rec.shape


def _item_problem(item_id: str, model: str, token_count: int, tokens: bytes) -> tuple[str, str] | None:
    """The one place the item rules live; decoders raise it, encoders refuse it."""
    if not item_id:
        return "empty-item-id", "item_id is empty"
    if not model:
        return "empty-model", f"item {item_id!r}: model is empty"
    if token_count < 1:
        return "negative-token-count", f"item {item_id!r}: token_count {token_count} < 1"
    if len(tokens) != 4 * token_count:
        return (
            "token-count-mismatch",
            f"item {item_id!r}: {len(tokens)} token bytes, expected 4 * {token_count} = {4 * token_count}",
        )
    return None


# --------------------------------------------------------------------------------------------------
# Hand-written Avro binary for TokenItem and Batch (the hot path)


class _Malformed(Exception):
    """Internal: the Avro body is not well formed (turned into DecodeError('avro-decode'))."""


def _read_long_slow(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos``, any length (callers inline the one-byte case).

    Unrolled: about twice as fast as a loop for the 6-10 byte timestamps and signatures that every
    item carries. A varint longer than 10 bytes or wider than 64 bits is malformed.
    """
    b = buf[pos]
    n = b & 0x7F
    if b >= 0x80:
        b = buf[pos + 1]
        n |= (b & 0x7F) << 7
        if b < 0x80:
            pos += 1
        else:
            b = buf[pos + 2]
            n |= (b & 0x7F) << 14
            if b < 0x80:
                pos += 2
            else:
                b = buf[pos + 3]
                n |= (b & 0x7F) << 21
                if b < 0x80:
                    pos += 3
                else:
                    n, pos = _read_long_tail(buf, pos + 4, n)
                    return (n >> 1) ^ -(n & 1), pos
    return (n >> 1) ^ -(n & 1), pos + 1


def _read_long_tail(buf: bytes, pos: int, n: int) -> tuple[int, int]:
    """Bytes 5-10 of a varint whose first four (value ``n``) all had the continuation bit."""
    b = buf[pos]
    n |= (b & 0x7F) << 28
    if b < 0x80:
        return n, pos + 1
    b = buf[pos + 1]
    n |= (b & 0x7F) << 35
    if b < 0x80:
        return n, pos + 2
    b = buf[pos + 2]
    n |= (b & 0x7F) << 42
    if b < 0x80:
        return n, pos + 3
    b = buf[pos + 3]
    n |= (b & 0x7F) << 49
    if b < 0x80:
        return n, pos + 4
    b = buf[pos + 4]
    n |= (b & 0x7F) << 56
    if b < 0x80:
        return n, pos + 5
    b = buf[pos + 5]
    if b > 1:
        raise _Malformed("varint longer than 10 bytes or wider than 64 bits")
    return n | (b << 63), pos + 6


_CONTINUED = bytes(range(0x80, 0x100))  # the bytes of a varint that has more bytes after them


def _skip_long(buf: bytes, pos: int) -> int:
    """The position after the varint at ``pos``, checked as :func:`_read_long_slow` checks it but not
    decoded: for fields the processor's hot path validates and never reads (``produced_ms``)."""
    raw = buf[pos : pos + 10]
    more = len(raw) - len(raw.lstrip(_CONTINUED))
    if more == len(raw) or (more == 9 and raw[9] > 1):
        raise _Malformed("varint runs past the end, or is longer than 10 bytes or wider than 64 bits")
    return pos + more + 1


# Shape signatures are hashes, so nearly every one is a 9- or 10-byte varint, the slow path: read each
# distinct encoding once and look it up by its bytes after that. A 10-byte key ending the varint can
# only be that varint (the first nine bytes carry continuation bits, the tenth does not), and the
# same holds for 9-byte keys; the dictionaries are bounded, past that the varint is decoded.
_SIGNATURES_10: dict[bytes, int] = {}
_SIGNATURES_9: dict[bytes, int] = {}
_MAX_SIGNATURES = 1 << 16
_U64 = 0xFFFFFFFFFFFFFFFF


def _read_signature(buf: bytes, pos: int) -> tuple[int, int]:
    """A shape signature (an Avro long) as the unsigned 64-bit int, one shared object per signature."""
    raw = buf[pos : pos + 10]
    shape = _SIGNATURES_10.get(raw)
    if shape is not None:
        return shape, pos + 10
    shape = _SIGNATURES_9.get(raw[:9])
    if shape is not None:
        return shape, pos + 9
    n, end = _read_long_slow(buf, pos)
    shape = n & _U64
    if end - pos == 10 and len(_SIGNATURES_10) < _MAX_SIGNATURES:
        _SIGNATURES_10[raw] = shape
    elif end - pos == 9 and len(_SIGNATURES_9) < _MAX_SIGNATURES:
        _SIGNATURES_9[raw[:9]] = shape
    return shape, end


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    return _read_long_slow(buf, pos)


def _read_int(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    n, pos = _read_long_slow(buf, pos)
    if not _INT_MIN <= n <= _INT_MAX:
        raise _Malformed(f"int field out of 32-bit range: {n}")
    return n, pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = _read_long_slow(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise _Malformed(f"length {n} at offset {pos} runs past the end ({len(buf)} bytes)")
    return buf[pos:end], end


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _read_bytes(buf, pos)
    return raw.decode("utf-8"), pos


def _read_block_count(buf: bytes, pos: int) -> tuple[int, int]:
    """An array/map block count; a negative count is followed by the block's byte size (skipped)."""
    count, pos = _read_long(buf, pos)
    if count < 0:
        count = -count
        _size, pos = _read_long(buf, pos)
    return count, pos


def _read_union_index(buf: bytes, pos: int) -> tuple[int, int]:
    index, pos = _read_long(buf, pos)
    if index not in (0, 1):
        raise _Malformed(f"union branch {index} does not exist")
    return index, pos


def _read_str_array(buf: bytes, pos: int) -> tuple[tuple[str, ...], int]:
    parts: list[str] = []
    count, pos = _read_block_count(buf, pos)
    while count:
        for _ in range(count):
            part, pos = _read_str(buf, pos)
            parts.append(part)
        count, pos = _read_block_count(buf, pos)
    return tuple(parts), pos


def _read_str_map(buf: bytes, pos: int) -> tuple[dict[str, str], int]:
    result: dict[str, str] = {}
    count, pos = _read_block_count(buf, pos)
    while count:
        for _ in range(count):
            key, pos = _read_str(buf, pos)
            result[key], pos = _read_str(buf, pos)
        count, pos = _read_block_count(buf, pos)
    return result, pos


# A frozen dataclass's __init__ stores each field through object.__setattr__ (about 1 us for
# TokenItemRecord); the decoder fills the slots through their descriptors instead (about 0.4 us).
# The field list is checked here so adding a field to TokenItemRecord fails loudly at import.
_ITEM_FIELDS = (
    "item_id", "job_id", "model", "shape", "token_count", "tokens",
    "shape_components", "produced_ms", "output_budget", "metadata",
)  # fmt: skip
if tuple(f.name for f in fields(TokenItemRecord)) != _ITEM_FIELDS:  # pragma: no cover
    raise ImportError("codec: TokenItemRecord fields changed; update _new_item_record")
(_s_id, _s_job, _s_model, _s_shape, _s_count, _s_tokens, _s_comp, _s_ms, _s_budget, _s_meta) = (
    getattr(TokenItemRecord, name).__set__ for name in _ITEM_FIELDS
)
_object_new = object.__new__


def _new_item_record(
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
    return rec


def _read_item_lead(buf: bytes, pos: int) -> tuple[str, bytes, bytes, int]:
    """A TokenItem's first three fields: ``item_id`` decoded, ``job_id`` and ``model`` as raw UTF-8.

    One call for the three strings, each length's one-byte case inlined: a function call per field
    is a third of the cost of decoding an item. Shared with :mod:`processor.fastpath`.
    """
    size = len(buf)
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = _read_long_slow(buf, pos)
    end = pos + n
    if n < 0 or end > size:
        raise _Malformed(f"item_id length {n} runs past the end")
    item_id = buf[pos:end].decode("utf-8")
    b = buf[end]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos = end + 1
    else:
        n, pos = _read_long_slow(buf, end)
    end = pos + n
    if n < 0 or end > size:
        raise _Malformed(f"job_id length {n} runs past the end")
    job_id = buf[pos:end]
    b = buf[end]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos = end + 1
    else:
        n, pos = _read_long_slow(buf, end)
    end = pos + n
    if n < 0 or end > size:
        raise _Malformed(f"model length {n} runs past the end")
    return item_id, job_id, buf[pos:end], end


_ItemRest = tuple[int, int, int, "tuple[str, ...] | None", int, "int | None", "dict[str, str] | None", int]


def _read_item_rest(buf: bytes, pos: int, want_ms: bool = True) -> _ItemRest:
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
        token_count, pos = _read_int(buf, pos)
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    elif buf[pos + 1] < 0x80:
        n = (b & 0x7F) | (buf[pos + 1] << 7)
        n = (n >> 1) ^ -(n & 1)
        pos += 2
    else:
        n, pos = _read_long_slow(buf, pos)
    start, end = pos, pos + n
    if n < 0 or end > len(buf):
        raise _Malformed(f"tokens length {n} runs past the end")
    pos = end
    # shape_components: union {null, array<string>}; a null branch is the single byte 0
    components: tuple[str, ...] | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = _read_union_index(buf, pos)
        if branch:
            components, pos = _read_str_array(buf, pos)
    if want_ms:
        produced_ms, pos = _read_long_slow(buf, pos)
    else:
        produced_ms, pos = 0, _skip_long(buf, pos)
    output_budget: int | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = _read_union_index(buf, pos)
        if branch:
            output_budget, pos = _read_int(buf, pos)
    metadata: dict[str, str] | None = None
    if buf[pos] == 0:
        pos += 1
    else:
        branch, pos = _read_union_index(buf, pos)
        if branch:
            metadata, pos = _read_str_map(buf, pos)
    return token_count, start, end, components, produced_ms, output_budget, metadata, pos


def _read_item_body(buf: bytes, pos: int) -> tuple[TokenItemRecord, int]:
    """One TokenItem body at ``pos``; well-formed Avro, not yet checked by :func:`_check_item`."""
    item_id, job_id, model, pos = _read_item_lead(buf, pos)
    shape, pos = _read_signature(buf, pos)
    token_count, start, end, components, produced_ms, output_budget, metadata, pos = _read_item_rest(buf, pos)
    rec = _new_item_record(
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
    )
    return rec, pos


def _check_item(rec: TokenItemRecord) -> None:
    """Structure first, then meaning: callers check trailing bytes before the item rules."""
    tokens = rec.tokens
    token_count = rec.token_count
    if not rec.item_id or not rec.model or token_count < 1 or len(tokens) != 4 * token_count:
        raise DecodeError(*cast(tuple[str, str], _item_problem(rec.item_id, rec.model, token_count, tokens)))


def _finish(value: bytes, pos: int, name: str) -> None:
    if pos != len(value):
        raise DecodeError("trailing-bytes", f"{len(value) - pos} bytes after the end of the {name} record")


_MALFORMED = (_Malformed, IndexError, UnicodeDecodeError)


def decode_token_item(value: bytes | bytearray | memoryview | None) -> TokenItemRecord:
    """Decode one input message (the hot path). Raises :class:`DecodeError` and nothing else."""
    value = _as_bytes(value)
    if value[:HEADER_SIZE] != _TOKEN_ITEM_HEADER:
        _check_header(value, "TokenItem")
    try:
        rec, pos = _read_item_body(value, HEADER_SIZE)
    except _MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed TokenItem: {exc}") from None
    _finish(value, pos, "TokenItem")
    _check_item(rec)
    return rec


def decode_batch(value: bytes | bytearray | memoryview | None) -> BatchRecord:
    """Decode a batch (what a consumer reads). Each item obeys the same rules as an input item."""
    value = _as_bytes(value)
    if value[:HEADER_SIZE] != _BATCH_HEADER:
        _check_header(value, "Batch")
    try:
        lead, pos = read_batch_lead(value)
        items: list[TokenItemRecord] = []
        count, pos = _read_block_count(value, pos)
        while count:
            for _ in range(count):
                item, pos = _read_item_body(value, pos)
                items.append(item)
            count, pos = _read_block_count(value, pos)
    except _MALFORMED as exc:
        raise DecodeError("avro-decode", f"malformed Batch: {exc}") from None
    _finish(value, pos, "Batch")
    for item in items:
        _check_item(item)
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
    )


def read_batch_lead(value: bytes) -> tuple[tuple[str, str, str, int, int, int, int, int, bool], int]:
    """A Batch's fields before its items, in :class:`BatchRecord` order (shape unsigned), and the
    position of the items. Raises what the readers raise on a malformed record (``_MALFORMED``)."""
    pos = HEADER_SIZE
    batch_id, pos = _read_str(value, pos)
    consumer, pos = _read_str(value, pos)
    model, pos = _read_str(value, pos)
    shape, pos = _read_long(value, pos)
    lane, pos = _read_int(value, pos)
    padded_length, pos = _read_int(value, pos)
    pad_multiple, pos = _read_int(value, pos)
    created_ms, pos = _read_long(value, pos)
    flag = value[pos]
    if flag > 1:
        raise _Malformed(f"boolean byte {flag}")
    lead = (batch_id, consumer, model, shape & _U64, lane, padded_length, pad_multiple, created_ms, flag == 1)
    return lead, pos + 1


_SMALL = [bytes([n << 1]) for n in range(64)]  # zigzag of 0..63 is one byte: 2n


def _long(n: int, field: str = "") -> bytes:
    """Zigzag varint of a signed 64-bit ``n`` (``field`` names it in the error when it does not fit)."""
    if 0 <= n < 64:
        return _SMALL[n]
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise ValueError(
            f"{field}={n} does not fit an Avro long" if field else f"{n} does not fit an Avro long"
        )
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _int(n: int, field: str) -> bytes:
    if not _INT_MIN <= n <= _INT_MAX:
        raise ValueError(f"{field}={n} does not fit an Avro int")
    return _long(n)


def _bytes(raw: bytes) -> bytes:
    return _long(len(raw)) + raw


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _long(len(raw)) + raw


def _item_parts(rec: TokenItemRecord, out: list[bytes | memoryview]) -> None:
    """Append the Avro body of one TokenItem to ``out`` (shared by item and batch encoders)."""
    problem = _item_problem(rec.item_id, rec.model, rec.token_count, rec.tokens)
    if problem is not None:
        raise ValueError(problem[1])
    out += (
        _str(rec.item_id),
        _str(rec.job_id),
        _str(rec.model),
        _long(to_signed(rec.shape)),
        _int(rec.token_count, "token_count"),
        _bytes(bytes(rec.tokens)),
    )
    components = rec.shape_components
    if components is None:
        out.append(b"\x00")
    else:
        out.append(b"\x02")
        if components:
            out.append(_long(len(components)))
            out += (_str(c) for c in components)
        out.append(b"\x00")
    out.append(_long(rec.produced_ms))
    if rec.output_budget is None:
        out.append(b"\x00")
    else:
        out += (b"\x02", _int(rec.output_budget, "output_budget"))
    metadata = rec.metadata
    if metadata is None:
        out.append(b"\x00")
    else:
        out.append(b"\x02")
        if metadata:
            out.append(_long(len(metadata)))
            for key, val in metadata.items():
                out += (_str(key), _str(val))
        out.append(b"\x00")


def encode_token_item(rec: TokenItemRecord) -> bytes:
    """One input message. Raises ``ValueError`` for a record :func:`decode_token_item` would reject."""
    out: list[bytes | memoryview] = [_TOKEN_ITEM_HEADER]
    _item_parts(rec, out)
    return b"".join(out)


def _encode_batch_parts(batch: Batch | BatchRecord, records: Sequence[TokenItemRecord | bytes]) -> bytes:
    out: list[bytes | memoryview] = [
        _BATCH_HEADER,
        _str(batch.batch_id),
        _str(batch.consumer),
        _str(batch.model),
        _long(to_signed(batch.shape)),
        _int(batch.lane, "lane"),
        _int(batch.padded_length, "padded_length"),
        _int(batch.pad_multiple, "pad_multiple"),
        _long(batch.created_ms),
        b"\x01" if batch.oversized else b"\x00",
    ]
    if records:
        out.append(_long(len(records)))
        for rec in records:
            if isinstance(rec, bytes):
                # an input message, validated when it was decoded: its body, past the header, as it is
                out.append(memoryview(rec)[HEADER_SIZE:])
            else:
                _item_parts(rec, out)
    out.append(b"\x00")
    return b"".join(out)


def encode_batch(batch: Batch) -> bytes:
    """A batch for its consumer; each ``batch.items[i].payload`` is a :class:`TokenItemRecord` or the
    ``bytes`` of its whole input message (``fastpath.ItemHead.message``).

    The bytes of an item inside the batch are exactly its input message minus the 10-byte header, so
    a kept message is spliced in past its header, and a record is re-encoded (no decode round trip).
    The message is kept whole rather than as a copy of its body: the copy was a tenth of the cost of
    taking an item in (docs/benchmarks.md), and the header's 10 bytes are all it saved.
    """
    records: list[TokenItemRecord | bytes] = []
    for item in batch.items:
        payload = item.payload
        if not isinstance(payload, TokenItemRecord | bytes):
            raise TypeError(f"item {item.id!r}: payload is {type(payload).__name__}, not TokenItemRecord")
        records.append(payload)
    return _encode_batch_parts(batch, records)


def encode_batch_record(batch: BatchRecord) -> bytes:
    """Same wire form as :func:`encode_batch`, from a decoded :class:`BatchRecord`."""
    return _encode_batch_parts(batch, batch.items)


# --------------------------------------------------------------------------------------------------
# fastavro paths: the TokenItem reference decoder and the records that are not hot

# What fastavro (and our int-range checks) raise on a malformed body. Hypothesis tests feed random
# bytes through every decoder to keep this list complete.
_FASTAVRO_ERRORS = (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError)

# Top-level int and long fields per record, with their ranges: fastavro does not range-check
# them (it writes any Python int as a varint), Java's reader would refuse what does not fit.
_RANGES = {"int": (_INT_MIN, _INT_MAX), "long": (_LONG_MIN, _LONG_MAX)}


def _number_fields(schema: Mapping[str, Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((f["name"], *_RANGES[f["type"]]) for f in schema["fields"] if f["type"] in ("int", "long"))


_ITEM_OUTCOME = next(f for f in _PARSED["CompletionBatch"]["fields"] if f["name"] == "items")["type"]["items"]
_NUMBER_FIELDS = {name: _number_fields(_PARSED[name]) for name in RECORD_NAMES}
_NUMBER_FIELDS["ItemOutcome"] = _number_fields(_ITEM_OUTCOME)


def _check_ints(name: str, record: Mapping[str, Any]) -> None:
    for field, low, high in _NUMBER_FIELDS[name]:
        value = record[field]
        if not low <= value <= high:
            raise ValueError(
                f"{name}.{field}={value} does not fit an Avro {'int' if high == _INT_MAX else 'long'}"
            )


def _fastavro_decode(value: bytes | bytearray | memoryview | None, name: str) -> dict[str, Any]:
    value = _as_bytes(value)
    if value[:HEADER_SIZE] != HEADERS[name]:
        _check_header(value, name)
    stream = io.BytesIO(value)
    stream.seek(HEADER_SIZE)
    try:
        record = cast(dict[str, Any], fastavro.schemaless_reader(stream, _PARSED[name], None, False))
        _check_ints(name, record)
    except _FASTAVRO_ERRORS as exc:
        raise DecodeError("avro-decode", f"malformed {name}: {type(exc).__name__}: {exc}") from None
    _finish(value, stream.tell(), name)
    return record


def _fastavro_encode(name: str, record: dict[str, Any]) -> bytes:
    _check_ints(name, record)
    stream = io.BytesIO()
    stream.write(HEADERS[name])
    fastavro.schemaless_writer(stream, _PARSED[name], record, strict=True)
    return stream.getvalue()


def decode_token_item_fastavro(value: bytes | bytearray | memoryview | None) -> TokenItemRecord:
    """Reference decoder (fastavro): same result and same errors as :func:`decode_token_item`."""
    d = _fastavro_decode(value, "TokenItem")
    components = d["shape_components"]
    budget = d["output_budget"]
    if budget is not None and not _INT_MIN <= budget <= _INT_MAX:
        raise DecodeError("avro-decode", f"malformed TokenItem: output_budget={budget} out of int range")
    rec = _new_item_record(
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
    )
    _check_item(rec)
    return rec


def encode_completion(rec: CompletionRecord) -> bytes:
    if rec.status not in STATUSES:
        raise ValueError(f"completion status {rec.status!r} is not one of {STATUSES}")
    return _fastavro_encode("Completion", {name: getattr(rec, name) for name in _COMPLETION_FIELDS})


def decode_completion(value: bytes | bytearray | memoryview | None) -> CompletionRecord:
    return CompletionRecord(**_fastavro_decode(value, "Completion"))


_COMPLETION_FIELDS = tuple(f["name"] for f in _PARSED["Completion"]["fields"])
_STATUS_BYTES = {status: _long(i) for i, status in enumerate(STATUSES)}


def _outcome_body(o: ItemOutcomeRecord) -> bytes:
    """One ``ItemOutcome`` in Avro binary (hand-written, so a split knows each item's exact size)."""
    status = _STATUS_BYTES.get(o.status)
    if status is None:
        raise ValueError(f"item {o.item_id!r}: completion status {o.status!r} is not one of {STATUSES}")
    return b"".join(
        (
            _str(o.item_id),
            status,
            b"\x01" if o.cache_hit else b"\x00",
            _str(o.job_id),
            b"\x00" if o.reason is None else b"\x02" + _str(o.reason),
            _int(o.input_tokens, "input_tokens"),
            _int(o.output_tokens, "output_tokens"),
            _bytes(bytes(o.output)),
            _long(o.queued_ms, "queued_ms"),
        )
    )


def _completion_batch_parts(rec: CompletionBatchRecord) -> tuple[bytes, list[bytes]]:
    """The header and batch fields, and each item's body: what every split of ``rec`` is made of."""
    lead = b"".join(
        (
            _COMPLETION_BATCH_HEADER,
            _str(rec.batch_id),
            _str(rec.consumer),
            _str(rec.model),
            _int(rec.padded_tokens, "padded_tokens"),
            _long(rec.engine_ms, "engine_ms"),
            _long(rec.completed_ms, "completed_ms"),
        )
    )
    return lead, [_outcome_body(o) for o in rec.items]


def _join_completion_batch(lead: bytes, bodies: Sequence[bytes]) -> bytes:
    if not bodies:
        return lead + b"\x00"
    return b"".join((lead, _long(len(bodies)), *bodies, b"\x00"))


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
        if run and size + len(body) + len(_long(len(run) + 1)) > max_bytes:
            messages.append(_join_completion_batch(lead, run))
            run, size = [], len(lead) + 1
        run.append(body)
        size += len(body)
    messages.append(_join_completion_batch(lead, run))
    return messages


def decode_completion_batch(value: bytes | bytearray | memoryview | None) -> CompletionBatchRecord:
    """A ``CompletionBatch`` (reference decoder, fastavro); the item ints are range-checked too."""
    d = _fastavro_decode(value, "CompletionBatch")
    try:
        for o in d["items"]:
            _check_ints("ItemOutcome", o)
    except ValueError as exc:
        raise DecodeError("avro-decode", f"malformed CompletionBatch: {exc}") from None
    d["items"] = [ItemOutcomeRecord(**o) for o in d["items"]]
    return CompletionBatchRecord(**d)


def decode_completions(value: bytes | bytearray | memoryview | None) -> list[CompletionRecord]:
    """Every completion a results message holds: a ``Completion`` (one) or a ``CompletionBatch``.

    What every reader of the results topic should call, since consumers write either form (the
    header tells them apart). Raises :class:`DecodeError` for anything else.
    """
    value = _as_bytes(value)
    if value[:HEADER_SIZE] == _COMPLETION_BATCH_HEADER:
        return decode_completion_batch(value).completions()
    return [decode_completion(value)]


def encode_contract(rec: ContractRecord) -> bytes:
    c = rec.contract
    return _fastavro_encode(
        "ConsumerContract",
        {
            "consumer": c.consumer,
            "model": c.model,
            "budget_tokens": c.budget_tokens,
            "max_items": c.max_items,
            "pad_multiple": c.pad_multiple,
            "max_inflight": c.max_inflight,
            "announced_ms": rec.announced_ms,
            "batching": c.batching,
            "memory_bytes": c.memory_bytes,
            "kv_bytes_per_token": c.kv_bytes_per_token,
            "default_output_tokens": c.default_output_tokens,
        },
    )


def decode_contract(value: bytes | bytearray | memoryview | None) -> ContractRecord:
    """A consumer's announcement; one that :class:`Contract` refuses is ``invalid-contract``.

    Announcements written before the batching fields existed (the previous writer schema, see
    ``PREVIOUS_CONTRACT_HEADER``) still decode: Avro schema resolution fills the fields' defaults,
    which mean tokens batching, exactly what those consumers asked for.
    """
    value = _as_bytes(value)
    if value[:HEADER_SIZE] == PREVIOUS_CONTRACT_HEADER:
        d = _decode_previous_contract(value)
    else:
        d = _fastavro_decode(value, "ConsumerContract")
    announced_ms = d.pop("announced_ms")
    try:
        contract = Contract(**d)
    except ValueError as exc:
        raise DecodeError("invalid-contract", str(exc)) from None
    return ContractRecord(contract, announced_ms)


#: Fields ``ConsumerContract`` gained with batching modes; without them it is the previous schema.
CONTRACT_FIELDS_ADDED = ("batching", "memory_bytes", "kv_bytes_per_token", "default_output_tokens")


def _previous_contract_schema() -> Any:
    raw = json.loads((schema_dir() / "ConsumerContract.avsc").read_text(encoding="utf-8"))
    raw["fields"] = [f for f in raw["fields"] if f["name"] not in CONTRACT_FIELDS_ADDED]
    return parse_schema(raw, {}, expand=True)


_PREVIOUS_CONTRACT = _previous_contract_schema()
#: The single-object header of announcements written with the previous ConsumerContract schema.
PREVIOUS_CONTRACT_HEADER = MAGIC + rabin_fingerprint(
    to_parsing_canonical_form(_PREVIOUS_CONTRACT).encode()
).to_bytes(8, "little")
_NAME_BY_FP_BYTES[PREVIOUS_CONTRACT_HEADER[2:]] = "ConsumerContract"


def _decode_previous_contract(value: bytes) -> dict[str, Any]:
    stream = io.BytesIO(value)
    stream.seek(HEADER_SIZE)
    try:
        reader = _PARSED["ConsumerContract"]
        record = cast(dict[str, Any], fastavro.schemaless_reader(stream, _PREVIOUS_CONTRACT, reader, False))
        _check_ints("ConsumerContract", record)
    except _FASTAVRO_ERRORS as exc:
        raise DecodeError("avro-decode", f"malformed ConsumerContract: {type(exc).__name__}: {exc}") from None
    _finish(value, stream.tell(), "ConsumerContract")
    return record


def encode_ledger_snapshot(rec: LedgerSnapshotRecord) -> bytes:
    return _fastavro_encode(
        "LedgerSnapshot",
        {
            "instance": rec.instance,
            "taken_ms": rec.taken_ms,
            "sequence": rec.sequence,
            "counters": rec.counters,
            "per_model": rec.per_model,
            "per_consumer": rec.per_consumer,
        },
    )


def decode_ledger_snapshot(value: bytes | bytearray | memoryview | None) -> LedgerSnapshotRecord:
    return LedgerSnapshotRecord(**_fastavro_decode(value, "LedgerSnapshot"))


def encode_dead_letter(rec: DeadLetterRecord) -> bytes:
    return _fastavro_encode(
        "DeadLetter",
        {
            "reason": rec.reason,
            "source_topic": rec.source_topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "original": bytes(rec.original),
            "original_key": None if rec.original_key is None else bytes(rec.original_key),
            "dead_ms": rec.dead_ms,
        },
    )


def decode_dead_letter(value: bytes | bytearray | memoryview | None) -> DeadLetterRecord:
    return DeadLetterRecord(**_fastavro_decode(value, "DeadLetter"))


_DECODERS: dict[str, Callable[[bytes], object]] = {
    "TokenItem": decode_token_item,
    "Batch": decode_batch,
    "Completion": decode_completion,
    "CompletionBatch": decode_completion_batch,
    "ConsumerContract": decode_contract,
    "LedgerSnapshot": decode_ledger_snapshot,
    "DeadLetter": decode_dead_letter,
}


def decode_any(value: bytes | bytearray | memoryview | None) -> object:
    """Decode whichever of our records the header names (for tools; services know what they read)."""
    value = _as_bytes(value)
    return _DECODERS[schema_of(value)](value)
