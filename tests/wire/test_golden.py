"""Golden messages (schemas/golden/): one encoded message of every record, held to the code.

A team writing a producer or a consumer app in another language checks its Avro library against
these bytes: encode the listed field values and compare the hex, decode the hex and compare the
values, compare its fingerprints with the listed ones. So this test holds the file to the codec both
ways (the fixed records, tests/wire/golden_values.py, encode to the file's hex, the hex decodes to
the fixed records), and
holds the listed field values to the schemas with fastavro's generic reader and writer, which know
nothing of the codec: what any Avro library reads from the hex is what the file lists, and what it
writes from the listed values is the hex. ``Batch.canonical.avsc`` is Batch's self-contained Parsing
Canonical Form (TokenItem inlined under its full name); it must give the codec's fingerprint.

The fixed values are chosen so that any library writes the same bytes: every map has one entry
(Avro leaves the order of a map's entries to the writer), and a shape signature of 2^63 or more
shows the signed long on the wire.

Regenerate the files (only when a schema changed on purpose, then review the diff):

    .venv/bin/python tests/wire/test_golden.py --write
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # not tests.common: this file also runs as a script
GOLDEN = ROOT / "schemas" / "golden"
MESSAGES = GOLDEN / "messages.json"
PREVIOUS_MESSAGES = GOLDEN / "previous.json"
REQUEST_MESSAGES = GOLDEN / "requests.json"
BATCH_CANONICAL = GOLDEN / "Batch.canonical.avsc"


if __name__ == "__main__":  # run as a script: make the repo importable without an install
    sys.path.insert(0, str(ROOT))

import fastavro  # noqa: E402
import pytest  # noqa: E402
from fastavro.schema import parse_schema, to_parsing_canonical_form  # noqa: E402

from processor.core.contract import contract_violation  # noqa: E402
from processor.core.item import Batch, Item  # noqa: E402
from processor.core.serving import serving_key  # noqa: E402
from processor.jobs import codec as jobs_codec  # noqa: E402
from processor.wire.completion_heads import decode_completions_head  # noqa: E402
from processor.wire.completions import (  # noqa: E402
    decode_completions,
)
from processor.wire.fastavro_io import (  # noqa: E402
    PreviousSchema,
    decode_token_item_fastavro,
)
from processor.wire.heads import decode_batch_head, decode_item_head  # noqa: E402
from processor.wire.items import (  # noqa: E402
    decode_batch,
    decode_token_item,
    encode_batch,
    encode_batch_record,
    encode_token_item,
)
from processor.wire.job_share import JOB_SHARE_CANONICAL_FORM, JOB_SHARE_HEADER  # noqa: E402
from processor.wire.request import GenerationRequest  # noqa: E402
from processor.wire.schemas import (  # noqa: E402
    CANONICAL_FORMS,
    FINGERPRINTS,
    HEADER_SIZE,
    HEADERS,
    RECORD_NAMES,
    rabin_fingerprint,
    schema_dir,
)
from tests.wire.golden_values import (  # noqa: E402
    BATCH,
    CONTRACT,
    FAILED,
    FULL_REQUEST,
    GOLDEN_BY_NAME,
    GOLDEN_RECORDS,
    ITEM,
    JOB_RECORDS,
    LABEL_SCHEMA,
    MODEL,
    OK,
    PREVIOUS_COMPLETION_RECORDS,
    PREVIOUS_ITEM_RECORDS,
    PREVIOUS_RECORDS,
    REQUEST_ITEMS,
    Golden,
    without_request,
)

# ------------------------------------------------------------------------------------------------
# the schemas as any Avro library reads them, and the codec's headers


def _generic_schemas() -> dict[str, Any]:
    """Every record's schema parsed straight from its .avsc file (TokenItem first: Batch names it)."""
    named: dict[str, Any] = {}
    return {
        name: parse_schema(
            json.loads((schema_dir() / f"{name}.avsc").read_text(encoding="utf-8")), named, expand=True
        )
        for name in (*RECORD_NAMES, *JOB_RECORDS)
    }


GENERIC = _generic_schemas()

CODEC_CANONICAL_FORMS = {
    **CANONICAL_FORMS,
    "Job": jobs_codec.CANONICAL_FORM,
    "JobShare": JOB_SHARE_CANONICAL_FORM,
}
CODEC_HEADERS = {**HEADERS, "Job": jobs_codec.HEADER, "JobShare": JOB_SHARE_HEADER}

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")


def to_json(schema: Any, value: Any) -> Any:
    """An Avro value as the file lists it: ``bytes`` as hex, a union's value without its branch."""
    return _convert_bytes(schema, value, bytes.hex)


def from_json(schema: Any, value: Any) -> Any:
    """The inverse of :func:`to_json`: what fastavro's writer takes."""
    return _convert_bytes(schema, value, bytes.fromhex)


def _convert_bytes(schema: Any, value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` of ``schema`` with every ``bytes`` value passed through ``convert``, the rest as is."""
    if isinstance(schema, list):
        return None if value is None else _convert_bytes(_branch(schema), value, convert)
    if isinstance(schema, dict) and schema["type"] not in _PRIMITIVES:
        kind = schema["type"]
        if kind == "record":
            return {f["name"]: _convert_bytes(f["type"], value[f["name"]], convert) for f in schema["fields"]}
        if kind == "array":
            return [_convert_bytes(schema["items"], v, convert) for v in value]
        if kind == "map":
            return {k: _convert_bytes(schema["values"], v, convert) for k, v in value.items()}
        return value  # an enum's symbol
    kind = schema["type"] if isinstance(schema, dict) else schema
    return convert(value) if kind == "bytes" else value


def _branch(union: list[Any]) -> Any:
    """The one non-null branch of a ``[null, X]`` union (every union of these schemas is one)."""
    (branch,) = [b for b in union if b != "null"]
    return branch


def generic_read(schema: Any, message: bytes) -> Any:
    """The record after the 10-byte header, read by fastavro's generic reader, as the file lists it."""
    body = io.BytesIO(message[HEADER_SIZE:])
    record = fastavro.schemaless_reader(body, schema, None)
    assert body.tell() == len(message) - HEADER_SIZE, "bytes left after the record"
    return to_json(schema, record)


def generic_write(schema: Any, fields: Any) -> bytes:
    """The Avro body fastavro's generic writer makes of the listed field values."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, from_json(schema, fields))
    return body.getvalue()


# ------------------------------------------------------------------------------------------------
# the files


def golden_document() -> dict[str, Any]:
    """What schemas/golden/messages.json holds, computed from the fixed values and the codec."""
    records = []
    for g in GOLDEN_RECORDS:
        message = g.encode(g.value)
        fingerprint = int.from_bytes(CODEC_HEADERS[g.name][2:], "little")
        records.append(
            {
                "record": g.name,
                "schema": f"schemas/{g.name}.avsc",
                "fingerprint": fingerprint,
                "header_hex": CODEC_HEADERS[g.name].hex(),
                "canonical_form": CODEC_CANONICAL_FORMS[g.name],
                "fields": generic_read(GENERIC[g.name], message),
                "message_hex": message.hex(),
            }
        )
    return {
        "description": (
            "One Avro single-object message of every tokenfabric record, built from fixed values "
            "(schemas/golden/README.md; tests/wire/test_golden.py holds it to the code). message_hex: "
            "the whole Kafka message value (C3 01, the 8-byte little-endian CRC-64-AVRO fingerprint of "
            "canonical_form, the Avro body). fields: the record's values in schema order: bytes as "
            "hex, a union's value without its branch name (or null), longs as exact JSON integers "
            "(shape is the signed long with the signature's bits), enums as their symbol."
        ),
        "records": records,
    }


def requests_document() -> dict[str, Any]:
    """What schemas/golden/requests.json holds: TokenItem messages of :data:`REQUEST_ITEMS`."""
    records = []
    for rec in REQUEST_ITEMS:
        message = encode_token_item(rec)
        records.append(
            {
                "record": "TokenItem",
                "header_hex": HEADERS["TokenItem"].hex(),
                "fields": generic_read(GENERIC["TokenItem"], message),
                "message_hex": message.hex(),
            }
        )
    return {
        "description": (
            "TokenItem messages whose requests show what the TokenItem of messages.json does not: an "
            "adapter, a choice list, a regex, a request naming only the adapter "
            "(tests/wire/test_golden.py; keys as in messages.json, schema and canonical form there)."
        ),
        "records": records,
    }


def previous_document() -> dict[str, Any]:
    """What schemas/golden/previous.json holds: each previous schema's message of the fixed values."""
    records = []
    for previous, g in PREVIOUS_RECORDS:
        message = g.encode(g.value)
        records.append(
            {
                "record": g.name,
                "header_hex": previous.header.hex(),
                "canonical_form": to_parsing_canonical_form(previous.schema),
                "fields": generic_read(previous.schema, message),
                "message_hex": message.hex(),
            }
        )
    return {
        "description": (
            "Messages written with a record's previous schema, before it gained fields with defaults "
            "(Completion and CompletionBatch before cached_tokens, TokenItem and Batch before "
            "request, Batch before attempts: what the processor writes while every item of a batch "
            "is on its first attempt): what a writer not yet upgraded sends. Readers still read them, "
            "filling the new fields' defaults (tests/wire/test_golden.py; keys as in messages.json)."
        ),
        "records": records,
    }


def write() -> None:
    GOLDEN.mkdir(exist_ok=True)
    document = json.dumps(golden_document(), indent=2, ensure_ascii=False) + "\n"
    MESSAGES.write_text(document, encoding="utf-8")
    previous = json.dumps(previous_document(), indent=2, ensure_ascii=False) + "\n"
    PREVIOUS_MESSAGES.write_text(previous, encoding="utf-8")
    requests = json.dumps(requests_document(), indent=2, ensure_ascii=False) + "\n"
    REQUEST_MESSAGES.write_text(requests, encoding="utf-8")
    # No newline: the file's bytes are exactly the canonical form the fingerprint is computed over.
    BATCH_CANONICAL.write_text(CANONICAL_FORMS["Batch"], encoding="utf-8")
    print(f"wrote {MESSAGES}, {PREVIOUS_MESSAGES}, {REQUEST_MESSAGES} and {BATCH_CANONICAL}")


def shipped() -> dict[str, dict[str, Any]]:
    document = json.loads(MESSAGES.read_text(encoding="utf-8"))
    return {r["record"]: r for r in document["records"]}


# ------------------------------------------------------------------------------------------------
# the tests

NAMES = [g.name for g in GOLDEN_RECORDS]


def test_the_file_holds_one_message_of_every_record_the_code_writes() -> None:
    assert list(shipped()) == [*RECORD_NAMES, *JOB_RECORDS]


def test_the_file_is_what_the_generator_writes() -> None:
    assert json.loads(MESSAGES.read_text(encoding="utf-8")) == golden_document()


@pytest.mark.parametrize("name", NAMES)
def test_encoding_the_fixed_values_gives_the_golden_bytes(name: str) -> None:
    g = GOLDEN_BY_NAME[name]
    assert g.encode(g.value).hex() == shipped()[name]["message_hex"]


@pytest.mark.parametrize("name", NAMES)
def test_decoding_the_golden_bytes_gives_the_fixed_values(name: str) -> None:
    g = GOLDEN_BY_NAME[name]
    assert g.decode(bytes.fromhex(shipped()[name]["message_hex"])) == g.value


@pytest.mark.parametrize("name", NAMES)
def test_any_avro_library_reads_the_listed_fields_from_the_golden_bytes(name: str) -> None:
    golden = shipped()[name]
    message = bytes.fromhex(golden["message_hex"])
    assert message[:HEADER_SIZE].hex() == golden["header_hex"] == CODEC_HEADERS[name].hex()
    assert generic_read(GENERIC[name], message) == golden["fields"]


@pytest.mark.parametrize("name", NAMES)
def test_any_avro_library_writes_the_golden_bytes_from_the_listed_fields(name: str) -> None:
    golden = shipped()[name]
    body = generic_write(GENERIC[name], golden["fields"])
    assert (bytes.fromhex(golden["header_hex"]) + body).hex() == golden["message_hex"]


@pytest.mark.parametrize("name", NAMES)
def test_the_listed_fingerprint_is_the_crc64_of_the_listed_canonical_form(name: str) -> None:
    golden = shipped()[name]
    assert golden["canonical_form"] == CODEC_CANONICAL_FORMS[name]
    assert golden["canonical_form"] == to_parsing_canonical_form(GENERIC[name])
    assert rabin_fingerprint(golden["canonical_form"].encode()) == golden["fingerprint"]
    assert golden["fingerprint"].to_bytes(8, "little") == bytes.fromhex(golden["header_hex"])[2:]


def test_the_batch_canonical_form_stands_alone_and_gives_the_codecs_fingerprint() -> None:
    """Parsed with no TokenItem known (as goavro's ``NewCodec`` takes one schema), it reads the
    golden Batch, and it is its own canonical form, so a library that canonicalises it again
    computes the same fingerprint."""
    text = BATCH_CANONICAL.read_bytes()
    assert text == CANONICAL_FORMS["Batch"].encode()
    assert rabin_fingerprint(text) == FINGERPRINTS["Batch"]
    alone = parse_schema(json.loads(text), {}, expand=True)
    assert to_parsing_canonical_form(alone) == text.decode()
    golden = shipped()["Batch"]
    assert generic_read(alone, bytes.fromhex(golden["message_hex"])) == golden["fields"]


def test_the_golden_batch_is_one_its_consumer_would_run() -> None:
    """The fixed values obey the rules docs/consumers.md states, so they can serve as its example:
    the batch fits the golden contract (the consumer app's own check), all of one shape, and its
    completions answer its items in order, a failed one with a reason and no output."""
    assert contract_violation(CONTRACT, BATCH) is None
    assert {item.shape for item in BATCH.items} == {BATCH.shape}
    assert [c.item_id for c in (OK, FAILED)] == [item.item_id for item in BATCH.items]
    assert all(c.queued_ms > 0 for c in (OK, FAILED))
    assert FAILED.output == b"" and FAILED.output_tokens == 0 and FAILED.reason


def test_the_previous_file_is_what_the_generator_writes() -> None:
    assert json.loads(PREVIOUS_MESSAGES.read_text(encoding="utf-8")) == previous_document()


@pytest.mark.parametrize(
    "index", range(len(PREVIOUS_COMPLETION_RECORDS)), ids=[g.name for _p, g in PREVIOUS_COMPLETION_RECORDS]
)
def test_a_message_in_the_previous_schema_still_reads_with_the_new_fields_defaults(index: int) -> None:
    """Every reader: the codec, ``decode_completions`` and the processor's head read the previous
    message as the fixed value with ``cached_tokens`` 0 and the rest as written."""
    previous, g = PREVIOUS_COMPLETION_RECORDS[index]
    golden = json.loads(PREVIOUS_MESSAGES.read_text(encoding="utf-8"))["records"][index]
    message = bytes.fromhex(golden["message_hex"])
    assert message[:HEADER_SIZE] == previous.header != CODEC_HEADERS[g.name]
    assert generic_read(previous.schema, message) == golden["fields"]
    assert "cached_tokens" not in golden["canonical_form"]
    assert g.decode(message) == g.value
    completions = decode_completions(message)
    assert [c.cached_tokens for c in completions] == [0] * len(completions)
    assert completions[0].cache_hit and completions[0].output == b"Hi!"
    head = decode_completions_head(message)
    assert head.items == [(c.item_id, c.status == "ok", c.cache_hit) for c in completions]
    assert head.cached_tokens == [0] * len(completions)


def test_the_new_golden_messages_carry_the_cached_count_to_every_reader() -> None:
    for name in ("Completion", "CompletionBatch"):
        message = bytes.fromhex(shipped()[name]["message_hex"])
        assert decode_completions(message)[0].cached_tokens == 2
        assert decode_completions_head(message).cached_tokens[0] == 2


def previous_item_message(name: str) -> bytes:
    """The message of ``name`` (TokenItem or Batch) in previous.json: written before ``request``."""
    records = json.loads(PREVIOUS_MESSAGES.read_text(encoding="utf-8"))["records"]
    (golden,) = [r for r in records if r["record"] == name and "request" not in r["canonical_form"]]
    return bytes.fromhex(golden["message_hex"])


@pytest.mark.parametrize(
    "previous, g", PREVIOUS_ITEM_RECORDS, ids=[g.name for _p, g in PREVIOUS_ITEM_RECORDS]
)
def test_items_and_batches_written_before_requests_read_with_no_request(
    previous: PreviousSchema, g: Golden
) -> None:
    """The header is the one docs/wire-format.md listed before ``request`` existed, and the hand
    codec, the reference decoder and the processor's heads read the message with no request."""
    message = previous_item_message(g.name)
    documented = {"TokenItem": "c301853bc0e98f62c25b", "Batch": "c3011c2df2a9198cf6b1"}[g.name]
    assert message[:HEADER_SIZE].hex() == previous.header.hex() == documented
    assert g.decode(message) == g.value
    if g.name == "TokenItem":
        assert decode_token_item_fastavro(message) == g.value
        head = decode_item_head(message)
        assert (head.item_id, head.model, head.message) == (ITEM.item_id, MODEL, message)
    else:
        assert [i.request for i in decode_batch_head(message).items] == [None, None]


def test_a_processor_splicing_an_item_written_before_requests_writes_a_current_batch() -> None:
    """The processor keeps each input message and splices its body into the batch: a message
    written before ``request`` gets the null request byte, so the batch reads as its records'."""
    old_item = previous_item_message("TokenItem")
    batch = dataclasses.replace(BATCH, items=[without_request(ITEM)], attempts=[])
    core_batch = Batch(
        batch.batch_id, batch.consumer, batch.model, batch.shape, batch.lane, batch.pad_multiple,
        batch.padded_length, [Item(ITEM.item_id, MODEL, ITEM.shape, ITEM.token_count, 0, old_item)],
        batch.created_ms, batch.oversized,
    )  # fmt: skip
    spliced = encode_batch(core_batch)
    assert spliced == encode_batch_record(batch)
    assert decode_batch(spliced) == batch


def test_the_requests_file_is_what_the_generator_writes() -> None:
    assert json.loads(REQUEST_MESSAGES.read_text(encoding="utf-8")) == requests_document()


@pytest.mark.parametrize("index", range(len(REQUEST_ITEMS)))
def test_every_reader_reads_the_request_golden_messages(index: int) -> None:
    """Any Avro library reads the listed fields and writes the hex from them; the hand codec, the
    reference decoder and the processor's head read the item, its head's model the serving key."""
    golden = json.loads(REQUEST_MESSAGES.read_text(encoding="utf-8"))["records"][index]
    rec = REQUEST_ITEMS[index]
    message = bytes.fromhex(golden["message_hex"])
    assert encode_token_item(rec) == message
    assert generic_read(GENERIC["TokenItem"], message) == golden["fields"]
    assert HEADERS["TokenItem"] + generic_write(GENERIC["TokenItem"], golden["fields"]) == message
    assert decode_token_item(message) == decode_token_item_fastavro(message) == rec
    assert rec.request is not None
    assert decode_item_head(message).model == serving_key(MODEL, rec.request.adapter)


def test_the_golden_item_carries_every_request_field() -> None:
    """So the golden TokenItem shows each field's encoding: none of its request's fields is left
    at its default, but the adapter and the two constraints a request may not add to json_schema."""
    defaults = GenerationRequest()
    unset = [
        f.name
        for f in dataclasses.fields(GenerationRequest)
        if getattr(FULL_REQUEST, f.name) == getattr(defaults, f.name)
    ]
    assert unset == ["adapter", "choices", "regex"]
    assert shipped()["TokenItem"]["fields"]["request"]["json_schema"] == LABEL_SCHEMA


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write()
