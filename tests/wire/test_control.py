"""The control records (processor/wire/control.py): consumer contracts, ledger snapshots and dead
letters round trip, and ``decode_any`` reads any record by its header."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.contract import Contract
from processor.wire.completions import decode_completion, encode_completion, encode_completion_batch
from processor.wire.control import (
    PREVIOUS_CONTRACT_HEADER,
    PREVIOUS_DEAD_LETTER_HEADER,
    decode_any,
    decode_contract,
    decode_dead_letter,
    decode_ledger_snapshot,
    encode_contract,
    encode_dead_letter,
    encode_ledger_snapshot,
)
from processor.wire.errors import DecodeError
from processor.wire.items import encode_batch, encode_token_item
from processor.wire.records import (
    BatchRecord,
    CompletionBatchRecord,
    CompletionRecord,
    ContractRecord,
    DeadLetterRecord,
    LedgerSnapshotRecord,
)
from processor.wire.schemas import HEADERS, parsed_schema, schema_of
from tests.common import ROOT
from tests.core.helpers import MODEL
from tests.wire.helpers import (
    BATCH_ITEMS,
    completion_batches,
    completions,
    contracts,
    dead_letters,
    fastavro_message,
    item,
    make_batch,
    reason_of,
    snapshots,
)


def test_contract_round_trip() -> None:
    rec = ContractRecord(Contract("gpu-0", "llama-3-8b", 8192, 64, pad_multiple=16, max_inflight=3), 1234)
    value = encode_contract(rec)
    assert schema_of(value) == "ConsumerContract"
    assert decode_contract(value) == rec


def test_contract_that_contract_refuses_is_invalid_contract() -> None:
    value = fastavro_message(
        "ConsumerContract",
        {
            "consumer": "gpu-0",
            "model": "m",
            "budget_tokens": 0,
            "max_items": 1,
            "pad_multiple": 8,
            "max_inflight": 1,
            "announced_ms": 0,
        },
    )
    assert reason_of(decode_contract, value) == "invalid-contract"


def test_ledger_snapshot_round_trip() -> None:
    rec = LedgerSnapshotRecord(
        instance="proc-0",
        taken_ms=1_732_000_000_000,
        sequence=42,
        counters={"received_items": 10, "received_tokens": 12345, "routed_items@gpu-0": 7},
        per_model={"llama-3-8b": {"received_tokens": 12345}, "empty": {}},
        per_consumer={"gpu-0": {"padded_tokens": 15000, "real_tokens": -1}},
    )
    value = encode_ledger_snapshot(rec)
    assert decode_ledger_snapshot(value) == rec
    empty = LedgerSnapshotRecord(
        instance="p", taken_ms=0, sequence=0, counters={}, per_model={}, per_consumer={}
    )
    assert decode_ledger_snapshot(encode_ledger_snapshot(empty)) == empty


@pytest.mark.parametrize("key", [None, b"", b"\xffkey"])
def test_dead_letter_round_trip(key: bytes | None) -> None:
    original = b"\xc3\x01garbage that failed to decode\x00\xff"
    rec = DeadLetterRecord(
        reason="unknown-schema",
        source_topic="tokenfabric.items",
        partition=3,
        offset=(1 << 40),
        original=original,
        original_key=key,
        dead_ms=99,
    )
    value = encode_dead_letter(rec)
    assert decode_dead_letter(value) == rec
    assert original in value


def test_decode_any_dispatches_on_the_header() -> None:
    assert decode_any(encode_token_item(item())) == item()
    assert isinstance(decode_any(encode_batch(make_batch(BATCH_ITEMS))), BatchRecord)
    assert reason_of(decode_any, b"\xc3\x01" + bytes(8)) == "unknown-schema"


@given(st.one_of(completions, completion_batches, snapshots, dead_letters, contracts))
def test_other_valid_records_round_trip(rec: Any) -> None:
    encode: Any = {
        CompletionRecord: encode_completion,
        CompletionBatchRecord: encode_completion_batch,
        LedgerSnapshotRecord: encode_ledger_snapshot,
        DeadLetterRecord: encode_dead_letter,
        ContractRecord: encode_contract,
    }[type(rec)]
    assert decode_any(encode(rec)) == rec


# ------------------------------------------------------------------------------ batching modes on the wire

# A ConsumerContract written by the codec before the batching fields existed (gpu-old, llama-3-8b,
# budget 16,384, 64 items, pad 16, 3 in flight, announced at 1,732,000,000,123).
OLD_CONTRACT = bytes.fromhex(
    "c301371330c05ee887300e6770752d6f6c64146c6c616d612d332d386280800280012006f6a1f5b3e864"
)


def test_an_announcement_in_the_previous_schema_decodes_as_tokens_batching() -> None:
    assert OLD_CONTRACT[:10] == PREVIOUS_CONTRACT_HEADER != HEADERS["ConsumerContract"]
    rec = decode_contract(OLD_CONTRACT)
    assert rec == ContractRecord(Contract("gpu-old", "llama-3-8b", 16384, 64, 16, 3), 1_732_000_000_123)
    assert rec.contract.batching == "tokens" and rec.contract.memory_bytes == 0
    assert schema_of(OLD_CONTRACT) == "ConsumerContract"
    assert decode_any(OLD_CONTRACT) == rec
    with pytest.raises(DecodeError) as info:
        decode_contract(OLD_CONTRACT + b"\x00")
    assert info.value.reason == "trailing-bytes"
    with pytest.raises(DecodeError) as info:
        decode_completion(OLD_CONTRACT)
    assert info.value.reason == "unknown-schema" and "ConsumerContract" in str(info.value)


def test_the_previous_header_is_the_one_the_wire_format_documented() -> None:
    # docs/wire-format.md listed c3 01 37 13 30 c0 5e e8 87 30 for ConsumerContract before the change.
    assert PREVIOUS_CONTRACT_HEADER.hex(" ") == "c3 01 37 13 30 c0 5e e8 87 30"
    assert HEADERS["ConsumerContract"].hex(" ") == "c3 01 52 cf 50 7b f5 64 34 a0"  # since adapter


@pytest.mark.parametrize(
    "c",
    [
        Contract("gpu-0", MODEL, 8192, 64, 16, 3),
        Contract("gpu-1", MODEL, 8192, 64, batching="rows"),
        Contract(
            "gpu-2",
            MODEL,
            8192,
            64,
            batching="memory",
            memory_bytes=40 << 30,
            kv_bytes_per_token=131_072,
            default_output_tokens=512,
        ),
    ],
    ids=["tokens", "rows", "memory"],
)
def test_contracts_of_every_mode_round_trip(c: Contract) -> None:
    rec = ContractRecord(c, 1234)
    value = encode_contract(rec)
    assert value[:10] == HEADERS["ConsumerContract"]
    assert decode_contract(value) == rec
    assert decode_contract(value).contract.rule == c.rule


def test_a_memory_announcement_without_its_numbers_is_an_invalid_contract() -> None:
    fields = {
        "consumer": "gpu-0",
        "model": MODEL,
        "budget_tokens": 1,
        "max_items": 1,
        "pad_multiple": 8,
        "max_inflight": 1,
        "announced_ms": 0,
        "batching": "memory",
        "memory_bytes": 0,
    }
    value = HEADERS["ConsumerContract"] + _avro_body(fields)
    with pytest.raises(DecodeError) as info:
        decode_contract(value)
    assert info.value.reason == "invalid-contract" and "memory_bytes" in str(info.value)


def _avro_body(record: dict[str, Any]) -> bytes:
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema("ConsumerContract"), record)
    return out.getvalue()


# ------------------------------------------------------------------------------ dead letters before detail


def test_a_dead_letter_written_before_detail_still_decodes() -> None:
    # DeadLetter before `detail` (header c3 01 cd de c9 b4 40 20 37 d5, as docs/wire-format.md listed
    # it), its reason still "code: detail"; written here with fastavro and that schema.
    assert PREVIOUS_DEAD_LETTER_HEADER.hex(" ") == "c3 01 cd de c9 b4 40 20 37 d5"
    assert HEADERS["DeadLetter"] != PREVIOUS_DEAD_LETTER_HEADER
    old = _previous_schema("DeadLetter", "detail")
    body = io.BytesIO()
    fastavro.schemaless_writer(
        body,
        old,
        {
            "reason": "bad-magic: not an Avro single-object message",
            "source_topic": "tokenfabric.ingest",
            "partition": 1,
            "offset": 7,
            "original": b"junk",
            "original_key": None,
            "dead_ms": 5,
        },
    )
    rec = decode_dead_letter(PREVIOUS_DEAD_LETTER_HEADER + body.getvalue())
    assert (rec.reason, rec.detail, rec.offset, rec.original) == (
        "bad-magic: not an Avro single-object message",
        None,
        7,
        b"junk",
    )
    assert schema_of(PREVIOUS_DEAD_LETTER_HEADER + body.getvalue()) == "DeadLetter"


def test_a_dead_letter_keeps_the_code_and_the_detail_apart() -> None:
    rec = DeadLetterRecord(
        reason="token-count-mismatch",
        detail="item 'a': 12 token bytes, expected 4 * 2 = 8",
        source_topic="t",
        partition=0,
        offset=0,
        original=b"",
        dead_ms=1,
    )
    value = encode_dead_letter(rec)
    assert value[:10] == HEADERS["DeadLetter"]
    assert decode_dead_letter(value) == rec


def _previous_schema(name: str, *added: str) -> Any:
    raw = json.loads((ROOT / "schemas" / f"{name}.avsc").read_text(encoding="utf-8"))
    raw["fields"] = [f for f in raw["fields"] if f["name"] not in added]
    return fastavro.parse_schema(raw)
