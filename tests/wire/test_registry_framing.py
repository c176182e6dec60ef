"""Registry-framed TokenItems (Confluent wire format) read as our own: the same schema spliced, a
producer's evolved schema resolved, an unknown id and an unresolvable schema refused with their own
reasons, and a silent registry never taken for bad input."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from processor.wire.errors import DecodeError
from processor.wire.heads import decode_item_head
from processor.wire.items import encode_batch, encode_token_item, new_item_record
from processor.wire.registry_framing import (
    UNKNOWN_SCHEMA_ID,
    UNRESOLVABLE_SCHEMA,
    RegistryFraming,
    RegistryUnavailable,
    frame,
    frame_single_object,
    is_registry_framed,
)
from processor.wire.schemas import CANONICAL_FORMS, HEADER_SIZE, HEADERS, schema_dir

OURS = json.loads((schema_dir() / "TokenItem.avsc").read_text())


class Source:
    """Writer schemas by id, as a registry would answer; ``down`` makes every lookup an outage."""

    def __init__(self, schemas: dict[int, Any]) -> None:
        self.schemas = {k: v if isinstance(v, str) else json.dumps(v) for k, v in schemas.items()}
        self.down = False
        self.asked: list[int] = []

    def schema_text(self, schema_id: int) -> str | None:
        self.asked.append(schema_id)
        if self.down:
            raise RegistryUnavailable("registry down")
        return self.schemas.get(schema_id)


def item(item_id: str = "a-1") -> bytes:
    rec = new_item_record(
        item_id, "", "m", 42, 3, b"\1\0\0\0\2\0\0\0\3\0\0\0", None, 1_700_000_000_000, 16, None
    )
    return encode_token_item(rec)


def evolved(namespace: str = "com.acme", extra: bool = True, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A producer's own TokenItem: another namespace, an extra optional field, fields left out."""
    fields = [f for f in OURS["fields"] if f["name"] not in drop]
    if extra:
        fields.append({"name": "team", "type": ["null", "string"], "default": None})
    return {**OURS, "namespace": namespace, "fields": fields}


def written(schema: dict[str, Any], record: dict[str, Any], schema_id: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return frame(schema_id, out.getvalue())


RECORD = {
    "item_id": "e-1", "job_id": "", "model": "m", "shape": 7, "token_count": 2,
    "tokens": b"\1\0\0\0\2\0\0\0", "shape_components": None, "produced_ms": 1_700_000_000_000,
    "output_budget": None, "metadata": None, "request": None,
}  # fmt: skip


def test_our_own_schema_is_spliced_byte_for_byte() -> None:
    source = Source({5: CANONICAL_FORMS["TokenItem"]})
    ours = item()
    framed = frame_single_object(5, ours)
    assert is_registry_framed(framed) and not is_registry_framed(ours)
    assert framed[:5] == b"\0\0\0\0\5" and framed[5:] == ours[HEADER_SIZE:]
    assert RegistryFraming(source).single_object(framed) == ours


def test_an_evolved_producer_schema_is_resolved_and_each_id_is_asked_once() -> None:
    source = Source({9: evolved()})
    framing = RegistryFraming(source)
    for n in range(3):
        head = decode_item_head(
            framing.single_object(written(evolved(), {**RECORD, "item_id": f"e-{n}", "team": "x"}, 9))
        )
        assert (head.item_id, head.model, head.shape, head.token_count) == (f"e-{n}", "m", 7, 2)
    assert source.asked == [9]
    assert (
        "_prefixed" in framing._readers[(9).to_bytes(4, "big")].__qualname__
    )  # ours, then theirs: walked, not resolved


def test_a_malformed_field_of_the_producers_own_is_avro_decode() -> None:
    message = written(evolved(), {**RECORD, "team": None}, 9)
    with pytest.raises(DecodeError) as err:
        RegistryFraming(Source({9: evolved()})).single_object(message[:-1] + b"\x09")  # union index -5
    assert err.value.reason == "avro-decode"


def test_fields_with_defaults_left_out_by_the_writer_read_as_their_defaults() -> None:
    schema = evolved(extra=False, drop=("request", "metadata"))
    record = {k: v for k, v in RECORD.items() if k not in ("request", "metadata")}
    head = decode_item_head(RegistryFraming(Source({3: schema})).single_object(written(schema, record, 3)))
    assert head.item_id == "e-1" and head.token_count == 2


def test_an_unknown_id_is_refused_with_its_reason_and_asked_again_next_time() -> None:
    source = Source({})
    framing = RegistryFraming(source)
    for _ in range(2):
        with pytest.raises(DecodeError) as err:
            framing.single_object(frame(77, b"\2a"))
        assert err.value.reason == UNKNOWN_SCHEMA_ID and "77" in str(err.value)
    assert source.asked == [77, 77]


@pytest.mark.parametrize(
    "schema",
    [
        {**OURS, "fields": [{**f, "type": "int"} if f["name"] == "model" else f for f in OURS["fields"]]},
        {**OURS, "fields": [f for f in OURS["fields"] if f["name"] != "model"]},
        {"type": "string"},
    ],
    ids=["model-an-int", "model-missing", "not-a-record"],
)
def test_a_writer_schema_that_cannot_be_resolved_is_refused_with_its_reason(schema: dict[str, Any]) -> None:
    record: Any = "x" if schema.get("type") == "string" else {**RECORD, "model": 5}
    if isinstance(record, dict) and not any(f["name"] == "model" for f in schema["fields"]):
        record.pop("model")
    with pytest.raises(DecodeError) as err:
        RegistryFraming(Source({4: schema})).single_object(written(schema, record, 4))
    assert err.value.reason == UNRESOLVABLE_SCHEMA


def test_a_silent_registry_is_not_bad_input_and_is_asked_again() -> None:
    source = Source({9: evolved()})
    source.down = True
    framing = RegistryFraming(source)
    message = written(evolved(), {**RECORD, "team": None}, 9)
    with pytest.raises(RegistryUnavailable):
        framing.single_object(message)
    source.down = False
    assert decode_item_head(framing.single_object(message)).item_id == "e-1"
    assert source.asked == [9, 9]


def test_trailing_bytes_after_a_resolved_record_are_refused() -> None:
    message = written(evolved(), {**RECORD, "team": None}, 9) + b"\0"
    with pytest.raises(DecodeError) as err:
        RegistryFraming(Source({9: evolved()})).single_object(message)
    assert err.value.reason == "trailing-bytes"


def test_our_schema_in_another_namespace_is_spliced_not_resolved() -> None:
    moved = evolved(namespace="com.acme", extra=False)
    message = written(moved, RECORD, 12)
    framing = RegistryFraming(Source({12: moved}))
    ours = framing.single_object(message)
    assert ours[HEADER_SIZE:] == message[5:]  # the body as it came
    assert decode_item_head(ours).item_id == "e-1"
    assert (
        "_splice" in framing._readers[(12).to_bytes(4, "big")].__qualname__
    )  # no Avro resolution per message


def test_a_registry_framed_results_message_reads_as_the_single_object_one() -> None:
    from processor.apps.endings import ended_messages
    from processor.core.item import Item
    from processor.wire.completion_heads import decode_completions_head
    from processor.wire.completions import decode_completions

    items = [Item(f"j-{n}", "m", 1, 10 + n, 0, job="j") for n in range(3)]
    [(_key, [ours], _items)] = ended_messages([(i, "cancelled") for i in items], 5, 1 << 20)
    framed = frame_single_object(77, ours)
    assert framed[:5] == b"\0\0\0\0\x4d" and framed[5:] == ours[HEADER_SIZE:]
    assert decode_completions(framed) == decode_completions(ours)
    assert [c.item_id for c in decode_completions(framed)] == ["j-0", "j-1", "j-2"]
    assert decode_completions_head(framed) == decode_completions_head(ours)
    with pytest.raises(DecodeError):  # a framed body that is not a CompletionBatch is refused as ever
        decode_completions(frame(77, b"\2a"))


def test_registry_framed_results_need_the_batch_form() -> None:
    from processor.apps.settings import ConsumerSettings

    assert ConsumerSettings(results_schema_id=3).results_schema_id == 3
    with pytest.raises(ValueError, match="--completions batch"):
        ConsumerSettings(completions="item", results_schema_id=3)


def _batch_of(payloads: list[Any]) -> bytes:
    from processor.core.item import Item
    from tests.wire.helpers import make_batch

    batch = make_batch([])
    batch.items = [Item(f"i-{n}", "m", 42, 3, arrival_ms=5, payload=p) for n, p in enumerate(payloads)]
    return encode_batch(batch)


@pytest.mark.parametrize("namespace", ["tokenfabric", "com.acme"])
def test_our_schema_in_any_namespace_is_read_in_place_and_spliced_into_the_batch(namespace: str) -> None:
    framing = RegistryFraming(Source({5: {**OURS, "namespace": namespace}}))
    ours = item("a-1")
    framed = frame_single_object(5, ours)
    first, again = framing.head(framed), framing.head(framed)  # the first reads the schema
    assert first == decode_item_head(ours)._replace(message=framed)
    assert again.message is framed  # no copy: the batch splices it past the frame
    assert _batch_of([again.message]) == _batch_of([ours])


def test_simple_fields_of_the_producers_own_are_checked_in_place_and_left_out_of_the_batch() -> None:
    framing = RegistryFraming(Source({9: evolved()}))
    for team in ("x", None, "é" * 80):
        message = written(evolved(), {**RECORD, "team": team}, 9)
        head = framing.head(message)
        assert isinstance(head.message, memoryview) and head.message.obj is message  # a view, no copy
        single = framing.single_object(message)
        assert head == decode_item_head(single)._replace(message=head.message)
        assert _batch_of([head.message]) == _batch_of([single])
    with pytest.raises(DecodeError) as err:  # refused as before: the general way says why
        framing.head(message[:-1] + b"\x09")
    assert err.value.reason == "avro-decode"


def test_fields_of_the_producers_own_that_are_not_simple_are_read_with_fastavro() -> None:
    schema = evolved(extra=False)
    schema["fields"] = [*schema["fields"], {"name": "tags", "type": {"type": "array", "items": "string"}}]
    framing = RegistryFraming(Source({4: schema}))
    head = framing.head(written(schema, {**RECORD, "tags": ["a", "b"]}, 4))
    assert type(head.message) is bytes and head.message[:HEADER_SIZE] == HEADERS["TokenItem"]
