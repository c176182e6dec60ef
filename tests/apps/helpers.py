"""Builders for what travels between the processor and a consumer app: token items with synthetic
tokens, a processor-style Batch of them, that batch as the consumer decodes it, and a card's contract."""

from __future__ import annotations

from processor.apps.producer import synthetic_tokens
from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.wire.items import decode_batch, encode_batch
from processor.wire.records import BatchRecord, TokenItemRecord

MODEL = "llama-test"


# ------------------------------------------------------------------------------------------------
# helpers


def token_record(
    item_id: str,
    length: int,
    shape: int,
    *,
    model: str = MODEL,
    produced_ms: int = 1_000,
    output_budget: int | None = None,
) -> TokenItemRecord:
    return TokenItemRecord(
        item_id=item_id,
        job_id="job-1",
        model=model,
        shape=shape,
        token_count=length,
        tokens=synthetic_tokens(item_id, length),
        produced_ms=produced_ms,
        output_budget=output_budget,
    )


def outgoing_batch(
    batch_id: str,
    consumer: str,
    records: list[TokenItemRecord],
    *,
    padded_length: int,
    model: str = MODEL,
    created_ms: int = 1_500,
) -> Batch:
    """A processor-style Batch whose items carry TokenItemRecords (what encode_batch wants)."""
    items = [Item(r.item_id, r.model, r.shape, r.token_count, r.produced_ms, payload=r) for r in records]
    return Batch(
        batch_id=batch_id,
        consumer=consumer,
        model=model,
        shape=records[0].shape if records else 1,
        lane=0,
        pad_multiple=8,
        padded_length=padded_length,
        items=items,
        created_ms=created_ms,
    )


def received(batch: Batch) -> BatchRecord:
    return decode_batch(encode_batch(batch))


def card_contract(consumer: str = "card-a", budget: int = 4096, items: int = 8) -> Contract:
    return Contract(consumer, MODEL, budget_tokens=budget, max_items=items, pad_multiple=8, max_inflight=2)
