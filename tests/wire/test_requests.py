"""``TokenItem.request`` on the wire (processor/wire/request_codec.py): the hand codec writes
fastavro's bytes and reads what fastavro reads, every decoder (the full record, the reference, the
processor's head, a batch and its head) refuses an invalid request or a model holding the serving
key's separator with the same reason, and the head schedules an item under its serving key."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given

from processor.core.serving import serving_key
from processor.wire.avro import encode_long
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import decode_token_item_fastavro
from processor.wire.heads import _usual_head, decode_batch_head, decode_item_head, general_item_head
from processor.wire.items import decode_batch, decode_token_item, encode_batch_record, encode_token_item
from processor.wire.records import BatchRecord, TokenItemRecord
from processor.wire.request import GenerationRequest
from processor.wire.request_codec import read_final_request, request_to_avro
from processor.wire.schemas import HEADER_SIZE, PREVIOUS_BATCH_HEADER, schema_dir
from tests.wire.helpers import (
    batch_message,
    batch_records,
    fastavro_message,
    generation_requests,
    item,
    item_dict,
    make_batch,
    outcome,
    raw_item,
    token_items,
)

ADAPTER_REQUEST = GenerationRequest(adapter="support-tone", temperature=0.0, choices=("yes", "no"))

SINGLE_DECODERS = [decode_token_item, decode_token_item_fastavro, decode_item_head, general_item_head]
SINGLE_IDS = ["hand", "fastavro", "head", "general-head"]


@given(token_items())
def test_the_hand_encoder_writes_fastavros_bytes_and_both_decoders_read_the_record(
    rec: TokenItemRecord,
) -> None:
    value = encode_token_item(rec)
    assert value == fastavro_message("TokenItem", item_dict(rec))
    assert decode_token_item(value) == decode_token_item_fastavro(value) == rec


@given(generation_requests())
def test_every_valid_request_round_trips_and_the_head_reads_its_adapter(request: GenerationRequest) -> None:
    rec = item(request=request)
    value = encode_token_item(rec)
    assert decode_token_item(value).request == request
    head = decode_item_head(value)
    assert head.model == serving_key(rec.model, request.adapter)
    assert head == general_item_head(value)


def test_an_item_with_an_adapter_is_scheduled_under_its_serving_key() -> None:
    value = encode_token_item(item(shape_components=None, metadata=None, request=ADAPTER_REQUEST))
    head = _usual_head(value)
    assert head is not None  # the one-pass reader takes items with a request too
    assert head.model == "llama-3-8b@support-tone" == general_item_head(value).model
    base = encode_token_item(item(request=replace(ADAPTER_REQUEST, adapter="")))
    assert decode_item_head(base).model == "llama-3-8b"
    assert decode_item_head(encode_token_item(item(request=None))).model == "llama-3-8b"


def test_a_request_read_before_is_the_same_object_and_trailing_bytes_are_still_refused() -> None:
    """The cache of whole requests answers by the bytes to the end of the message: appending a
    byte makes other bytes, which are read and refused."""
    value = encode_token_item(item(request=ADAPTER_REQUEST))
    first = decode_token_item(value).request
    assert first == ADAPTER_REQUEST
    assert decode_token_item(value).request is first
    again = decode_token_item(value + b"").request
    assert again is first
    for decoder in SINGLE_DECODERS:
        assert outcome(decoder, value + b"\0") == "trailing-bytes"
    start = value.index(b"\x02\x18support-tone") + 1  # after the union branch, at the adapter
    assert read_final_request(value + b"\0", start)[2] == len(value)


INVALID_REQUESTS = [
    (GenerationRequest(adapter="a@b"), "adapter 'a@b' contains '@'"),
    (GenerationRequest(json_schema="{}", regex="x"), "more than one structured-output constraint"),
    (GenerationRequest(temperature=-0.5), "temperature -0.5"),
    (GenerationRequest(temperature=float("nan")), "temperature nan"),
    (GenerationRequest(top_p=0.0), "top_p 0.0"),
    (GenerationRequest(top_k=-1), "top_k -1"),
    (GenerationRequest(logprobs=-2), "logprobs -2"),
    (GenerationRequest(stop=("",)), "an empty stop string"),
    (GenerationRequest(choices=("a", "")), "an empty choice"),
    (GenerationRequest(json_schema="[1]"), "json_schema is not the JSON text of an object"),
    (GenerationRequest(extra="not json"), "extra is not the JSON text of an object"),
]


@pytest.mark.parametrize(("request_", "why"), INVALID_REQUESTS, ids=[w for _r, w in INVALID_REQUESTS])
@pytest.mark.parametrize("decoder", SINGLE_DECODERS, ids=SINGLE_IDS)
def test_an_invalid_request_is_refused_with_its_reason(
    request_: GenerationRequest, why: str, decoder: Any
) -> None:
    """Written by another language's Avro library (fastavro here, past the codec's checks), it goes
    to the dead-letter topic as ``invalid-request``, the detail saying what is wrong."""
    value = raw_item(request=request_to_avro(request_))
    with pytest.raises(DecodeError) as info:
        decoder(value)
    assert info.value.reason == "invalid-request"
    assert "'item-1': invalid request: " + why in str(info.value)


@pytest.mark.parametrize(("request_", "why"), INVALID_REQUESTS[:3], ids=[w for _r, w in INVALID_REQUESTS[:3]])
def test_the_encoder_refuses_an_invalid_request(request_: GenerationRequest, why: str) -> None:
    with pytest.raises(ValueError, match="invalid request"):
        encode_token_item(item(request=request_))


@pytest.mark.parametrize("decoder", SINGLE_DECODERS, ids=SINGLE_IDS)
def test_a_model_holding_the_separator_is_refused_as_an_invalid_model(decoder: Any) -> None:
    value = raw_item(model="llama@tone")
    with pytest.raises(DecodeError) as info:
        decoder(value)
    assert info.value.reason == "invalid-model"
    assert "model 'llama@tone' contains '@'" in str(info.value)
    with pytest.raises(ValueError, match="contains '@'"):
        encode_token_item(item(model="llama@tone"))


def test_the_item_rules_come_before_the_request_rules() -> None:
    """A message breaking several rules gets the first one's reason (errors.py), the request last."""
    value = raw_item(item_id="", request=request_to_avro(GenerationRequest(top_k=-1)))
    assert {outcome(d, value) for d in SINGLE_DECODERS} == {"empty-item-id"}


def request_bytes(priority: int = 0, top_k: int | None = None, stop_token_ids: tuple[int, ...] = ()) -> bytes:
    """A request's Avro binary written field by field, so an int may be out of its range (fastavro's
    writer and the codec's refuse that): the fields not named here null or empty."""
    top_k_field = b"\x00" if top_k is None else b"\x02" + encode_long(top_k)
    ids = (
        b"".join((encode_long(len(stop_token_ids)), *map(encode_long, stop_token_ids)))
        if stop_token_ids
        else b""
    )
    # adapter "", priority, temperature, top_p, top_k, seed, stop, stop_token_ids, then logprobs,
    # json_schema, choices, regex, extra
    return b"".join(
        (b"\x00", encode_long(priority), b"\x00\x00", top_k_field, b"\x00\x00", ids, b"\x00", b"\x00" * 5)
    )


def test_request_bytes_writes_what_the_codec_writes() -> None:
    expected = encode_token_item(item(request=GenerationRequest(priority=3, top_k=5, stop_token_ids=(9,))))
    plain = encode_token_item(item(request=None))
    assert plain[:-1] + b"\x02" + request_bytes(3, 5, (9,)) == expected


@pytest.mark.parametrize(
    "fields",
    [{"priority": 1 << 31}, {"top_k": 1 << 31}, {"top_k": -(1 << 31) - 1}, {"stop_token_ids": (1 << 31,)}],
    ids=["priority", "top_k", "top_k-negative", "stop_token_ids"],
)
def test_a_request_int_out_of_range_is_malformed_for_both_decoders(fields: dict[str, Any]) -> None:
    message = encode_token_item(item(request=None))[:-1] + b"\x02" + request_bytes(**fields)
    assert (
        outcome(decode_token_item, message) == outcome(decode_token_item_fastavro, message) == "avro-decode"
    )
    assert outcome(decode_item_head, message) == "avro-decode"


def test_a_batch_carries_each_items_request_to_both_batch_readers() -> None:
    records = [
        item(item_id="a", request=ADAPTER_REQUEST),
        item(item_id="b", request=None),
        item(item_id="c", request=GenerationRequest(seed=7)),
    ]
    batch = batch_records(make_batch(records, model="llama-3-8b@support-tone"))
    value = encode_batch_record(batch)
    assert decode_batch(value) == batch
    assert [i.request for i in decode_batch_head(value).items] == [r.request for r in records]


def test_a_batch_item_with_an_invalid_request_is_refused_by_both_batch_readers() -> None:
    bad = {**item_dict(item(item_id="b")), "request": request_to_avro(GenerationRequest(top_p=2.0))}
    value = batch_message([item_dict(item(item_id="a", request=ADAPTER_REQUEST)), bad])
    assert outcome(decode_batch, value) == outcome(decode_batch_head, value) == "invalid-request"


def test_the_header_says_whether_a_batchs_items_carry_a_request() -> None:
    """The same items without their request bytes are a previous-schema batch under the previous
    header, and a malformed one under the current header."""
    rec: BatchRecord = batch_records(make_batch([item(request=None)]))
    value = encode_batch_record(rec)
    assert value[-2:] == b"\x00\x00"  # the item's null request, the end of the items
    without = value[HEADER_SIZE:-2] + b"\x00"
    assert decode_batch(PREVIOUS_BATCH_HEADER + without) == rec
    assert outcome(decode_batch, value[:HEADER_SIZE] + without) == "avro-decode"


def test_the_request_record_in_the_schema_is_the_python_type_field_for_field() -> None:
    """schemas/TokenItem.avsc's GenerationRequest has GenerationRequest's fields in its order, each
    with a doc and a default, and ``request`` is TokenItem's last field (so a message without a
    request is the previous body plus the byte 00)."""
    raw = json.loads((schema_dir() / "TokenItem.avsc").read_text(encoding="utf-8"))
    last = raw["fields"][-1]
    assert last["name"] == "request" and last["default"] is None and last["doc"].strip()
    null, record = last["type"]
    assert null == "null" and record["name"] == "GenerationRequest" and record["doc"].strip()
    assert [f["name"] for f in record["fields"]] == [f.name for f in dataclasses.fields(GenerationRequest)]
    assert all(f["doc"].strip() and "default" in f for f in record["fields"])
    defaults = GenerationRequest()
    for f in record["fields"]:
        value = getattr(defaults, f["name"])
        assert f["default"] == (list(value) if isinstance(value, tuple) else value), f["name"]
