"""TokenItem and Batch messages (processor/wire/items.py): round trips byte-identical to fastavro's,
every rejection reason from both TokenItem decoders, and the encoder refusing what the decoder rejects."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.wire.completions import encode_completion
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import decode_token_item_fastavro
from processor.wire.items import (
    decode_batch,
    decode_token_item,
    encode_batch,
    encode_batch_record,
    encode_token_item,
)
from processor.wire.records import TokenItemRecord, tokens_from_ids
from processor.wire.schemas import HEADERS, parsed_schema
from tests.wire.helpers import (
    BATCH_ITEMS,
    ITEM_DECODER_IDS,
    ITEM_DECODERS,
    U64,
    batch_message,
    batch_records,
    completion_rec,
    fastavro_batch,
    fastavro_message,
    int32,
    item,
    item_dict,
    make_batch,
    raw_item,
    reason_of,
    token_items,
)

# ------------------------------------------------------------------------------------------------
# TokenItem round trips


@pytest.mark.parametrize(
    "rec",
    [
        item(),
        item(job_id="", shape_components=None, output_budget=None, metadata=None),
        item(shape_components=(), metadata={}),
        item(shape=0, produced_ms=0, output_budget=0),
        item(shape=U64, produced_ms=-1),
        item(shape=1 << 63, produced_ms=(1 << 63) - 1, output_budget=(1 << 31) - 1),
        item(token_count=8000, tokens=tokens_from_ids(range(8000))),
    ],
)
@pytest.mark.parametrize("decoder", ITEM_DECODERS, ids=ITEM_DECODER_IDS)
def test_token_item_round_trip(rec: TokenItemRecord, decoder: Any) -> None:
    value = encode_token_item(rec)
    assert value[:10] == HEADERS["TokenItem"]
    assert value == fastavro_message("TokenItem", item_dict(rec))
    assert decoder(value) == rec


def test_decode_accepts_bytearray_and_memoryview() -> None:
    value = encode_token_item(item())
    assert decode_token_item(bytearray(value)) == item()
    assert decode_token_item(memoryview(value)) == item()


def test_shape_travels_as_the_signed_long_with_the_same_bits() -> None:
    value = encode_token_item(item(shape=U64))
    raw = fastavro.schemaless_reader(io.BytesIO(value[10:]), parsed_schema("TokenItem"))
    assert isinstance(raw, dict) and raw["shape"] == -1


# ------------------------------------------------------------------------------------------------
# TokenItem rejections: each reason, from both decoders

REJECTIONS: list[tuple[str, Any]] = [
    ("bad-magic", b""),
    ("bad-magic", None),
    ("bad-magic", b"\xc3"),
    ("bad-magic", b"\xc3\x01\x00"),
    ("bad-magic", b'{"item_id": "x"}'),
    ("bad-magic", b"\xc3\x02" + encode_token_item(item())[2:]),
    ("bad-magic", encode_token_item(item())[10:]),
    ("unknown-schema", b"\xc3\x01" + bytes(8) + encode_token_item(item())[10:]),
    ("unknown-schema", HEADERS["Batch"] + encode_token_item(item())[10:]),
    ("avro-decode", HEADERS["TokenItem"]),
    ("avro-decode", encode_token_item(item())[:-1]),
    ("avro-decode", encode_token_item(item())[:40]),
    ("avro-decode", HEADERS["TokenItem"] + b"\x04\xff\xfe" + bytes(40)),  # item_id not UTF-8
    ("avro-decode", HEADERS["TokenItem"] + b"\x01" + bytes(40)),  # negative string length
    ("avro-decode", HEADERS["TokenItem"] + b"\x7e" + bytes(40)),  # string past the end
    ("avro-decode", encode_token_item(item(metadata=None))[:-1] + b"\x04"),  # union branch 2
    ("trailing-bytes", encode_token_item(item()) + b"\x00"),
    ("trailing-bytes", encode_token_item(item()) * 2),
    ("negative-token-count", raw_item(token_count=0, tokens=b"")),
    ("negative-token-count", raw_item(token_count=-3, tokens=b"")),
    ("token-count-mismatch", raw_item(token_count=2)),
    ("token-count-mismatch", raw_item(token_count=3, tokens=b"\x00" * 13)),
    ("empty-model", raw_item(model="")),
    ("empty-item-id", raw_item(item_id="")),
]


@pytest.mark.parametrize(("reason", "value"), REJECTIONS)
@pytest.mark.parametrize("decoder", ITEM_DECODERS, ids=ITEM_DECODER_IDS)
def test_token_item_rejections(reason: str, value: Any, decoder: Any) -> None:
    assert reason_of(decoder, value) == reason


def test_other_schema_is_named_in_the_message() -> None:
    completion = encode_completion(completion_rec())
    with pytest.raises(DecodeError, match=r"tokenfabric\.Completion, expected tokenfabric\.TokenItem"):
        decode_token_item(completion)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"item_id": ""}, "item_id"),
        ({"model": ""}, "model"),
        ({"token_count": 0, "tokens": b""}, "token_count"),
        ({"token_count": 2}, "token bytes"),
        ({"output_budget": 1 << 31}, "output_budget"),
        ({"shape": -1}, "signature"),
        ({"shape": 1 << 64}, "signature"),
        ({"produced_ms": 1 << 63}, "long"),
    ],
)
def test_encoder_refuses_what_the_decoder_rejects(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_token_item(item(**changes))


@pytest.mark.parametrize("records", [BATCH_ITEMS, BATCH_ITEMS[:1], []], ids=["three", "one", "empty"])
@pytest.mark.parametrize("oversized", [False, True])
def test_batch_round_trip(records: list[TokenItemRecord], oversized: bool) -> None:
    batch = make_batch(records, oversized=oversized, shape=U64)
    value = encode_batch(batch)
    expected = batch_records(batch)
    assert value == fastavro_batch(expected)
    assert decode_batch(value) == expected
    assert encode_batch_record(expected) == value


def test_items_inside_a_batch_are_their_messages_without_the_header() -> None:
    value = encode_batch(make_batch(BATCH_ITEMS))
    bodies = b"".join(encode_token_item(r)[10:] for r in BATCH_ITEMS)
    assert bodies in value
    assert value.endswith(bodies + b"\x00")


def test_encode_batch_needs_token_item_payloads() -> None:
    batch = make_batch(BATCH_ITEMS)
    batch.items[1].payload = {"item_id": "item-2"}
    with pytest.raises(TypeError, match="item-2"):
        encode_batch(batch)


def test_decode_batch_rejections() -> None:
    good = encode_batch(make_batch(BATCH_ITEMS))
    assert reason_of(decode_batch, encode_token_item(item())) == "unknown-schema"
    assert reason_of(decode_batch, good[:-1]) == "avro-decode"
    assert reason_of(decode_batch, good + b"\x00") == "trailing-bytes"
    assert reason_of(decode_batch, b"") == "bad-magic"
    bad_item = batch_message([{**item_dict(item()), "token_count": 2}])
    assert reason_of(decode_batch, bad_item) == "token-count-mismatch"


@given(token_items())
def test_valid_token_items_round_trip(rec: TokenItemRecord) -> None:
    value = encode_token_item(rec)
    assert value == fastavro_message("TokenItem", item_dict(rec))
    assert decode_token_item(value) == rec
    assert decode_token_item_fastavro(value) == rec


@given(st.lists(token_items(), max_size=4), st.integers(0, U64), int32, st.booleans())
def test_valid_batches_round_trip(records: list[TokenItemRecord], shape: int, lane: int, big: bool) -> None:
    batch = make_batch(records, shape=shape, lane=lane, oversized=big)
    value = encode_batch(batch)
    assert value == fastavro_batch(batch_records(batch))
    assert decode_batch(value) == batch_records(batch)
