"""processor/wire/skips.py: a skipper steps over exactly what fastavro wrote and refuses a malformed value."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from processor.wire.errors import MALFORMED
from processor.wire.skips import fields_skipper, skipper

CASES = [
    ("null", None), ("boolean", True), ("int", -(2**31)), ("long", 2**62), ("float", 1.5),
    ("double", -2.25), ("string", "é" * 70), ("bytes", b"\0" * 3), (["null", "string"], None),
    (["null", "string"], "team"), (["string", "long", "null"], 7), ({"type": "string"}, "x"),
]  # fmt: skip


def written(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "v", "type": schema}]}), {"v": value})  # fmt: skip
    return out.getvalue()


@pytest.mark.parametrize(("schema", "value"), CASES)
def test_a_skipper_steps_over_exactly_what_fastavro_wrote(schema: Any, value: Any) -> None:
    buf = b"\1\2" + written(schema, value)
    skip = skipper(schema)
    assert skip is not None and skip(buf, 2) == len(buf)


@pytest.mark.parametrize(
    ("schema", "buf"),
    [("int", b"\x80\x80\x80\x80\x20"), ("string", b"\x04\xff\xfe"), ("string", b"\x08ab"), ("bytes", b"\x03"),
     ("boolean", b"\x02"), (["null", "string"], b"\x04"), ("double", b"\0\0\0"), ("long", b"\x80")],
)  # fmt: skip
def test_a_malformed_value_is_refused(schema: Any, buf: bytes) -> None:
    skip = skipper(schema)
    assert skip is not None
    with pytest.raises(MALFORMED):
        skip(buf, 0)


def test_types_it_does_not_handle_get_no_skipper() -> None:
    assert skipper({"type": "array", "items": "string"}) is None
    assert skipper(["null", {"type": "map", "values": "long"}]) is None
    assert skipper("com.acme.Named") is None
    assert fields_skipper([{"name": "a", "type": "long"}, {"name": "b", "type": {"type": "enum"}}]) is None
    two = fields_skipper([{"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"]}])
    assert two is not None and two(b"\x02\x02\x04hi", 0) == 5
