"""Skippers: Avro values of simple types checked and stepped over without building them.

A producer's TokenItem with fields of its own after ours (processor/wire/registry_framing.py) has
those fields checked on every message; reading them with fastavro cost more than the rest of the
item. :func:`fields_skipper` builds, once per writer schema, a function that walks them with this
package's own readers (the same checks: varint bounds, int range, UTF-8, lengths within the
message). Invariant: a skipper accepts only what fastavro would read; anything it does not handle
(a named type, an array, a map, a record, an enum, fixed) gets no skipper, and the caller reads
those fields with fastavro as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from processor.wire.avro import read_int, read_long, read_str, skip_long
from processor.wire.errors import Malformed

Skip = Callable[[bytes, int], int]
"""The position after the value at ``pos``; raises a ``MALFORMED`` error on a malformed value."""


def _null(buf: bytes, pos: int) -> int:
    return pos


def _boolean(buf: bytes, pos: int) -> int:
    if buf[pos] > 1:
        raise Malformed(f"boolean byte {buf[pos]} at offset {pos}")
    return pos + 1


def _int(buf: bytes, pos: int) -> int:
    return read_int(buf, pos)[1]


def _fixed(size: int) -> Skip:
    def skip(buf: bytes, pos: int) -> int:
        if pos + size > len(buf):
            raise Malformed(f"{size} bytes at offset {pos} run past the end ({len(buf)} bytes)")
        return pos + size

    return skip


def _string(buf: bytes, pos: int) -> int:
    b = buf[pos]
    if b < 0x80 and not b & 1:  # a short string: its length in one byte
        end = pos + 1 + (b >> 1)
        if end > len(buf):
            raise Malformed(f"length {b >> 1} at offset {pos} runs past the end ({len(buf)} bytes)")
        buf[pos + 1 : end].decode("utf-8")
        return end
    return read_str(buf, pos)[1]


def _bytes(buf: bytes, pos: int) -> int:
    n, pos = read_long(buf, pos)
    if n < 0 or pos + n > len(buf):
        raise Malformed(f"length {n} at offset {pos} runs past the end ({len(buf)} bytes)")
    return pos + n


_PRIMITIVES: dict[str, Skip] = {
    "null": _null, "boolean": _boolean, "int": _int, "long": skip_long, "float": _fixed(4),
    "double": _fixed(8), "string": _string, "bytes": _bytes,
}  # fmt: skip


def skipper(schema: Any) -> Skip | None:
    """A skipper for a value of ``schema`` (Avro JSON), or None for a type it does not handle."""
    if isinstance(schema, dict) and isinstance(schema.get("type"), str):
        schema = schema["type"] if schema["type"] in _PRIMITIVES else None
    if isinstance(schema, str):
        return _PRIMITIVES.get(schema)
    if not isinstance(schema, list) or not schema:
        return None
    branches = [skipper(branch) for branch in schema]
    if any(b is None for b in branches):
        return None
    return _union([b for b in branches if b is not None])


def _union(branches: list[Skip]) -> Skip:
    if len(branches) == 2 and branches[0] is _null:  # an optional field, the usual evolution
        value = branches[1]

        def optional(buf: bytes, pos: int) -> int:
            b = buf[pos]
            if b == 0:
                return pos + 1
            if b == 2:
                return value(buf, pos + 1)
            raise Malformed(f"union branch byte {b} at offset {pos}")

        return optional

    def skip(buf: bytes, pos: int) -> int:
        index, pos = read_long(buf, pos)
        if not 0 <= index < len(branches):
            raise Malformed(f"union branch {index} does not exist")
        return branches[index](buf, pos)

    return skip


def fields_skipper(fields: Sequence[Any]) -> Skip | None:
    """A skipper for a record's ``fields`` (Avro JSON) in order, or None if one is not handled."""
    skips = [skipper(f.get("type")) if isinstance(f, dict) else None for f in fields]
    if not skips or any(s is None for s in skips):
        return None
    steps = [s for s in skips if s is not None]
    if len(steps) == 1:
        return steps[0]

    def skip(buf: bytes, pos: int) -> int:
        for step in steps:
            pos = step(buf, pos)
        return pos

    return skip
