"""The control records: consumer contracts, ledger snapshots, dead letters, and ``decode_any``.

Contracts written by an older consumer (before ``CONTRACT_FIELDS_ADDED``) are still read, under
``PREVIOUS_CONTRACT_HEADER``, and dead letters written before ``detail`` under
``PREVIOUS_DEAD_LETTER_HEADER`` (:class:`~processor.wire.fastavro_io.PreviousSchema`).
"""

from __future__ import annotations

from collections.abc import Callable

from processor.core.contract import Contract
from processor.wire.completions import decode_completion, decode_completion_batch
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import PreviousSchema, fastavro_decode, fastavro_encode
from processor.wire.items import decode_batch, decode_token_item
from processor.wire.records import ContractRecord, DeadLetterRecord, LedgerSnapshotRecord
from processor.wire.schemas import HEADER_SIZE, as_bytes, schema_of


def encode_contract(rec: ContractRecord) -> bytes:
    c = rec.contract
    return fastavro_encode(
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
    value = as_bytes(value)
    if value[:HEADER_SIZE] == PREVIOUS_CONTRACT_HEADER:
        d = _PREVIOUS_CONTRACT.decode(value)
    else:
        d = fastavro_decode(value, "ConsumerContract")
    announced_ms = d.pop("announced_ms")
    try:
        contract = Contract(**d)
    except ValueError as exc:
        raise DecodeError("invalid-contract", str(exc)) from None
    return ContractRecord(contract, announced_ms)


#: Fields ``ConsumerContract`` gained with batching modes; without them it is the previous schema.
CONTRACT_FIELDS_ADDED = ("batching", "memory_bytes", "kv_bytes_per_token", "default_output_tokens")
_PREVIOUS_CONTRACT = PreviousSchema("ConsumerContract", CONTRACT_FIELDS_ADDED)
#: The single-object header of announcements written with the previous ConsumerContract schema.
PREVIOUS_CONTRACT_HEADER = _PREVIOUS_CONTRACT.header

DUPLICATE_ITEM_ID = "duplicate-item-id"
"""The dead-letter reason of a producer's repeat: an ``item_id`` its ingest partition already took
within the processor's dedupe window (docs/producers.md). Not a ``DecodeError``: the message is valid."""

#: ``DeadLetter`` gained ``detail`` when ``reason`` became the short code alone.
DEAD_LETTER_FIELDS_ADDED = ("detail",)
_PREVIOUS_DEAD_LETTER = PreviousSchema("DeadLetter", DEAD_LETTER_FIELDS_ADDED)
#: The header of dead letters written before ``detail`` (their ``reason`` reads "code: detail").
PREVIOUS_DEAD_LETTER_HEADER = _PREVIOUS_DEAD_LETTER.header


def encode_ledger_snapshot(rec: LedgerSnapshotRecord) -> bytes:
    return fastavro_encode(
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
    return LedgerSnapshotRecord(**fastavro_decode(value, "LedgerSnapshot"))


def encode_dead_letter(rec: DeadLetterRecord) -> bytes:
    return fastavro_encode(
        "DeadLetter",
        {
            "reason": rec.reason,
            "source_topic": rec.source_topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "original": bytes(rec.original),
            "original_key": None if rec.original_key is None else bytes(rec.original_key),
            "dead_ms": rec.dead_ms,
            "detail": rec.detail,
        },
    )


def decode_dead_letter(value: bytes | bytearray | memoryview | None) -> DeadLetterRecord:
    """A dead letter, also one written before ``detail`` existed (``PREVIOUS_DEAD_LETTER_HEADER``)."""
    value = as_bytes(value)
    if value[:HEADER_SIZE] == PREVIOUS_DEAD_LETTER_HEADER:
        return DeadLetterRecord(**_PREVIOUS_DEAD_LETTER.decode(value))
    return DeadLetterRecord(**fastavro_decode(value, "DeadLetter"))


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
    value = as_bytes(value)
    return _DECODERS[schema_of(value)](value)
