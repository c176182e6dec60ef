"""A consumer contract names the adapter it serves (processor/wire/control.py, issue #26).

On the wire ``ConsumerContract`` carries ``model`` and ``adapter`` apart; in the core the contract's
``model`` is their serving key (processor/core/serving.py). These tests hold the codec to that join,
to reading announcements written before ``adapter`` existed as the base model, and to refusing names
that would read back as another pair.
"""

from __future__ import annotations

import io
from typing import Any, cast

import fastavro
import pytest

from processor.core.contract import Contract
from processor.core.serving import serving_key
from processor.wire.control import (
    PRE_ADAPTER_CONTRACT_HEADER,
    PREVIOUS_CONTRACT_HEADER,
    decode_any,
    decode_contract,
    encode_contract,
)
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import fastavro_encode
from processor.wire.records import ContractRecord
from processor.wire.schemas import HEADER_SIZE, HEADERS, parsed_schema, schema_of

# The golden ConsumerContract as the codec wrote it before ``adapter`` (schemas/golden/messages.json
# then): card-a, llama-3-8b, budget 4,096, 32 items, pad 8, 2 in flight, tokens batching.
PRE_ADAPTER_CONTRACT = bytes.fromhex(
    "c301564cca77afdb351c0c636172642d61146c6c616d612d332d38628040401004e080d5edee6602000000"
)
ANNOUNCED_MS = 1_767_225_598_000


def wire_fields(value: bytes) -> dict[str, Any]:
    """What any Avro library reads from ``value``'s body with the current schema."""
    stream = io.BytesIO(value[HEADER_SIZE:])
    return cast(
        dict[str, Any], fastavro.schemaless_reader(stream, parsed_schema("ConsumerContract"), None, False)
    )


def announcement(**fields: Any) -> bytes:
    """A current-schema announcement with ``fields`` over a valid tokens contract."""
    base = {
        "consumer": "card-a",
        "model": "llama-3-8b",
        "budget_tokens": 4096,
        "max_items": 32,
        "pad_multiple": 8,
        "max_inflight": 2,
        "announced_ms": ANNOUNCED_MS,
        "batching": "tokens",
        "memory_bytes": 0,
        "kv_bytes_per_token": 0,
        "default_output_tokens": 0,
        "adapter": "",
    }
    return fastavro_encode("ConsumerContract", {**base, **fields})


def test_an_adapter_contract_goes_on_the_wire_as_model_and_adapter_and_comes_back_as_its_serving_key() -> (
    None
):
    contract = Contract("card-tone", serving_key("llama-3-8b", "support-tone"), 4096, 32)
    value = encode_contract(ContractRecord(contract, ANNOUNCED_MS))
    assert value[:HEADER_SIZE] == HEADERS["ConsumerContract"]
    fields = wire_fields(value)
    assert (fields["model"], fields["adapter"]) == ("llama-3-8b", "support-tone")
    rec = decode_contract(value)
    assert rec == ContractRecord(contract, ANNOUNCED_MS)
    assert rec.contract.model == "llama-3-8b@support-tone"
    assert decode_any(value) == rec


def test_a_base_model_contract_writes_an_empty_adapter_and_keeps_its_bare_model() -> None:
    contract = Contract("card-a", "llama-3-8b", 4096, 32)
    value = encode_contract(ContractRecord(contract, ANNOUNCED_MS))
    assert wire_fields(value)["adapter"] == ""
    assert decode_contract(value).contract.model == "llama-3-8b"


def test_an_announcement_written_before_adapter_reads_as_the_base_model() -> None:
    header = PRE_ADAPTER_CONTRACT[:HEADER_SIZE]
    assert header == PRE_ADAPTER_CONTRACT_HEADER
    assert header not in (HEADERS["ConsumerContract"], PREVIOUS_CONTRACT_HEADER)
    assert PRE_ADAPTER_CONTRACT_HEADER.hex(" ") == "c3 01 56 4c ca 77 af db 35 1c"  # docs/wire-format.md
    assert schema_of(PRE_ADAPTER_CONTRACT) == "ConsumerContract"
    rec = decode_contract(PRE_ADAPTER_CONTRACT)
    assert rec == ContractRecord(Contract("card-a", "llama-3-8b", 4096, 32, 8, 2), ANNOUNCED_MS)
    with pytest.raises(DecodeError) as info:
        decode_contract(PRE_ADAPTER_CONTRACT + b"\x00")
    assert info.value.reason == "trailing-bytes"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"model": "llama@3"}, "model 'llama@3'"),
        ({"adapter": "tone@v2"}, "adapter 'tone@v2'"),
        ({"model": "llama@3", "adapter": "tone"}, "model 'llama@3'"),
    ],
)
def test_a_name_holding_the_separator_is_an_invalid_contract_naming_it(
    fields: dict[str, str], named: str
) -> None:
    with pytest.raises(DecodeError) as info:
        decode_contract(announcement(**fields))
    assert info.value.reason == "invalid-contract"
    assert named in str(info.value) and "card-a" in str(info.value)


def test_an_adapter_of_no_model_is_an_invalid_contract() -> None:
    with pytest.raises(DecodeError) as info:
        decode_contract(announcement(model="", adapter="support-tone"))
    assert info.value.reason == "invalid-contract" and "model must not be empty" in str(info.value)
