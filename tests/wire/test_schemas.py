"""The schema files and the message header (processor/wire/schemas.py): documented records in one
namespace, packaged byte for byte, and a header of magic plus the Rabin fingerprint that fastavro and
the Avro spec's own vectors agree on."""

from __future__ import annotations

import json
from typing import Any

import fastavro
import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.jobs import codec as jobs_codec
from processor.wire.items import encode_token_item
from processor.wire.schemas import (
    CANONICAL_FORMS,
    FINGERPRINTS,
    HEADER_SIZE,
    HEADERS,
    RECORD_NAMES,
    fastavro_fingerprint,
    rabin_fingerprint,
    schema_dir,
    schema_of,
)
from tests.common import ROOT
from tests.wire.helpers import U64, item, reason_of

# ------------------------------------------------------------------------------------------------
# schema files


def test_every_schema_file_is_a_documented_record_in_our_namespace() -> None:
    files = sorted(p.stem for p in (ROOT / "schemas").glob("*.avsc"))
    # Job and JobShare are not on the hot path: jobs/codec.py and wire/job_share.py read them with fastavro
    assert files == sorted((*RECORD_NAMES, jobs_codec.SCHEMA_NAME, "JobShare"))
    for name in files:
        schema = json.loads((ROOT / "schemas" / f"{name}.avsc").read_text(encoding="utf-8"))
        assert schema["type"] == "record"
        assert schema["name"] == name
        assert schema["namespace"] == "tokenfabric"
        assert schema["doc"]
        for field in schema["fields"]:
            assert isinstance(field.get("doc"), str) and field["doc"].strip(), f"{name}.{field['name']}"


def test_packaged_schema_copies_are_byte_identical() -> None:
    source = ROOT / "schemas"
    packaged = ROOT / "processor" / "wire" / "avsc"
    assert sorted(p.name for p in packaged.glob("*.avsc")) == sorted(p.name for p in source.glob("*.avsc"))
    for path in source.glob("*.avsc"):
        assert (packaged / path.name).read_bytes() == path.read_bytes(), path.name


def test_codec_reads_the_packaged_copy_first() -> None:
    assert schema_dir() == ROOT / "processor" / "wire" / "avsc"


def test_batch_reuses_token_item_by_name() -> None:
    raw = json.loads((ROOT / "schemas" / "Batch.avsc").read_text(encoding="utf-8"))
    items = next(f for f in raw["fields"] if f["name"] == "items")
    assert items["type"] == {"type": "array", "items": "tokenfabric.TokenItem"}
    # ... and the canonical form (hence the fingerprint) inlines the full TokenItem definition.
    assert CANONICAL_FORMS["TokenItem"] in CANONICAL_FORMS["Batch"]


def test_completion_batch_defines_the_same_status_enum_and_documents_its_item_fields() -> None:
    raw = json.loads((ROOT / "schemas" / "CompletionBatch.avsc").read_text(encoding="utf-8"))
    outcome = next(f for f in raw["fields"] if f["name"] == "items")["type"]["items"]
    assert outcome["doc"] and all(f["doc"].strip() for f in outcome["fields"])
    single = json.loads((ROOT / "schemas" / "Completion.avsc").read_text(encoding="utf-8"))

    def status(fields: list[dict[str, Any]]) -> Any:
        return next(f for f in fields if f["name"] == "status")["type"]

    assert status(outcome["fields"]) == status(single["fields"])
    # every field of a Completion is in the batch form, once: at batch level or per item
    names = [f["name"] for f in raw["fields"] if f["name"] != "items"] + [
        f["name"] for f in outcome["fields"]
    ]
    assert sorted(names) == sorted(f["name"] for f in single["fields"])


# ------------------------------------------------------------------------------------------------
# header and fingerprints

# From the Avro repository's share/test/data/schema-tests.txt (canonical form, Java's signed long).
AVRO_SPEC_FINGERPRINTS = [
    ('"null"', 7195948357588979594),
    ('"int"', 8247732601305521295),
    ('"string"', -8142146995180207161),
    ('{"name":"foo","type":"record","fields":[]}', -4824392279771201922),
    ('{"name":"x.y.foo","type":"record","fields":[]}', 5916914534497305771),
    ('{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}', -4448647247586288245),
    ('{"type":"map","values":"string"}', -8732877298790414990),
    (
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"},{"name":"f2","type":"int"}]}',
        -4860222112080293046,
    ),
]


# Also from schema-tests.txt: input -> Parsing Canonical Form, to check fastavro's canonicaliser.
AVRO_SPEC_CANONICAL = [
    (
        '{"fields":[], "type":"record", "name":"foo", "namespace":"x.y", "doc":"d", "aliases":["z"]}',
        '{"name":"x.y.foo","type":"record","fields":[]}',
    ),
    (
        '{"namespace":"x.y.z", "type":"enum", "name":"foo", "doc":"foo bar", "symbols":["A1", "A2"]}',
        '{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}',
    ),
    (
        '{ "fields":[{"type":"boolean", "aliases":[], "name":"f1", "default":true},'
        '{"order":"descending","name":"f2","doc":"Hello","type":"int"}], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"},{"name":"f2","type":"int"}]}',
    ),
]


@pytest.mark.parametrize(("canonical", "java_long"), AVRO_SPEC_FINGERPRINTS)
def test_rabin_fingerprint_matches_the_avro_spec_vectors(canonical: str, java_long: int) -> None:
    assert rabin_fingerprint(canonical.encode()) == java_long & U64


@pytest.mark.parametrize(("schema", "canonical"), AVRO_SPEC_CANONICAL)
def test_fastavro_canonical_form_matches_the_avro_spec(schema: str, canonical: str) -> None:
    assert to_parsing_canonical_form(parse_schema(json.loads(schema))) == canonical


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_header_is_magic_plus_fastavros_rabin_fingerprint_little_endian(name: str) -> None:
    header = HEADERS[name]
    assert header[:2] == b"\xc3\x01"
    assert len(header) == HEADER_SIZE == 10
    assert FINGERPRINTS[name] == fastavro_fingerprint(name)
    hex_le = fastavro.schema.fingerprint(CANONICAL_FORMS[name], "CRC-64-AVRO")
    assert header[2:] == bytes.fromhex(hex_le)
    assert header[2:] == FINGERPRINTS[name].to_bytes(8, "little")


def test_fingerprints_are_distinct_and_docs_do_not_change_them() -> None:
    assert len(set(FINGERPRINTS.values())) == len(RECORD_NAMES)
    raw = json.loads((ROOT / "schemas" / "TokenItem.avsc").read_text(encoding="utf-8"))
    for field in raw["fields"]:
        field["doc"] = "changed"
    assert to_parsing_canonical_form(parse_schema(raw)) == CANONICAL_FORMS["TokenItem"]


def test_schema_of_names_the_record() -> None:
    assert schema_of(encode_token_item(item())) == "TokenItem"
    assert reason_of(schema_of, b"\xc3\x01" + bytes(8)) == "unknown-schema"
    assert reason_of(schema_of, b"{}") == "bad-magic"
