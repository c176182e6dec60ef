"""The control records: consumer contracts, ledger snapshots, dead letters, and ``decode_any``.

Contracts written by an older consumer are still read: before ``CONTRACT_FIELDS_ADDED`` under
``PREVIOUS_CONTRACT_HEADER``, before ``adapter`` under ``PRE_ADAPTER_CONTRACT_HEADER``; and dead
letters written before ``detail`` under ``PREVIOUS_DEAD_LETTER_HEADER``
(:class:`~processor.wire.fastavro_io.PreviousSchema`).

A contract's adapter lives in the core's :class:`Contract` as its serving key: ``Contract.model`` is
``serving_key(model, adapter)`` (processor/core/serving.py), so the core keys the adapter's lanes,
switch order, shares and books apart from the base model's with no field of its own. The codec is
the one place that joins and splits the two, and it refuses a model or adapter name holding the
separator (they would read back as another pair).
"""

from __future__ import annotations

from collections.abc import Callable

from processor.core.contract import Contract
from processor.core.serving import SEPARATOR, serving_key, split_serving_key
from processor.wire.completions import decode_completion, decode_completion_batch
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import PreviousSchema, fastavro_decode, fastavro_encode
from processor.wire.items import decode_batch, decode_token_item
from processor.wire.records import ContractRecord, DeadLetterRecord, LedgerSnapshotRecord
from processor.wire.schemas import HEADER_SIZE, as_bytes, schema_of


def encode_contract(rec: ContractRecord) -> bytes:
    """``rec`` on the wire: ``Contract.model``, a serving key, as the ``model`` and ``adapter`` fields."""
    c = rec.contract
    model, adapter = split_serving_key(c.model)
    return fastavro_encode(
        "ConsumerContract",
        {
            "consumer": c.consumer,
            "model": model,
            "budget_tokens": c.budget_tokens,
            "max_items": c.max_items,
            "pad_multiple": c.pad_multiple,
            "max_inflight": c.max_inflight,
            "announced_ms": rec.announced_ms,
            "batching": c.batching,
            "memory_bytes": c.memory_bytes,
            "kv_bytes_per_token": c.kv_bytes_per_token,
            "default_output_tokens": c.default_output_tokens,
            "adapter": adapter,
        },
    )


def decode_contract(value: bytes | bytearray | memoryview | None) -> ContractRecord:
    """A consumer's announcement; one that :class:`Contract` refuses, or whose model or adapter name
    holds the serving key's separator, is ``invalid-contract``. Its contract's ``model`` is the
    serving key of the announced model and adapter.

    Announcements written before the batching fields existed (``PREVIOUS_CONTRACT_HEADER``) or before
    ``adapter`` (``PRE_ADAPTER_CONTRACT_HEADER``) still decode: Avro schema resolution fills the
    fields' defaults, which mean tokens batching and the base model, exactly what those consumers
    asked for.
    """
    value = as_bytes(value)
    previous = _PREVIOUS_CONTRACTS.get(bytes(value[:HEADER_SIZE]))
    d = previous.decode(value) if previous is not None else fastavro_decode(value, "ConsumerContract")
    announced_ms = d.pop("announced_ms")
    model, adapter = d.pop("model"), d.pop("adapter")
    for what, name in (("model", model), ("adapter", adapter)):
        if SEPARATOR in name:
            raise DecodeError(
                "invalid-contract",
                f"contract {d['consumer']}: {what} {name!r} contains {SEPARATOR!r} "
                f"(it joins model and adapter in the processor's serving key)",
            )
    try:
        # An adapter of no model is no serving key: Contract refuses the empty model.
        contract = Contract(model=serving_key(model, adapter) if model else "", **d)
    except ValueError as exc:
        raise DecodeError("invalid-contract", str(exc)) from None
    return ContractRecord(contract, announced_ms)


#: Fields ``ConsumerContract`` gained with batching modes; without them (and ``adapter``) it is the
#: schema before batching modes.
CONTRACT_FIELDS_ADDED = ("batching", "memory_bytes", "kv_bytes_per_token", "default_output_tokens")
#: The field ``ConsumerContract`` gained with adapters (issue #26): "" is the base model.
CONTRACT_ADAPTER_ADDED = ("adapter",)
_PREVIOUS_CONTRACT = PreviousSchema("ConsumerContract", CONTRACT_FIELDS_ADDED + CONTRACT_ADAPTER_ADDED)
#: The single-object header of announcements written before batching modes.
PREVIOUS_CONTRACT_HEADER = _PREVIOUS_CONTRACT.header
_PRE_ADAPTER_CONTRACT = PreviousSchema("ConsumerContract", CONTRACT_ADAPTER_ADDED)
#: The header of announcements written with batching modes but before ``adapter``.
PRE_ADAPTER_CONTRACT_HEADER = _PRE_ADAPTER_CONTRACT.header
_PREVIOUS_CONTRACTS = {
    _PREVIOUS_CONTRACT.header: _PREVIOUS_CONTRACT,
    _PRE_ADAPTER_CONTRACT.header: _PRE_ADAPTER_CONTRACT,
}

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
