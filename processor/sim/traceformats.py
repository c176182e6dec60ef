"""The three trace formats, line by line, into :class:`TraceRecord`: what each field must be.

``jsonl`` (native)
    One JSON object per line: ``{"t_ms": int, "model": str, "shape": int | "components": [str, ...],
    "length": int, "id": str, "output_length": int, "job": str, "adapter": str}``. Exactly one of
    ``shape`` (an unsigned 64-bit signature) or ``components`` (hashed with :func:`shape_signature`).
    ``id``, ``output_length``, ``job`` and ``adapter`` are optional; a missing ``id`` becomes the
    0-based index of the line in the file, a missing ``job`` is "" (no job: docs/shares.md), a missing
    ``adapter`` is "" (the base model; a LoRA adapter's items are scheduled apart: processor/core/
    serving.py). Neither ``model`` nor ``adapter`` may contain ``@``. Unknown keys are
    ignored, so producers can carry extra fields (prompt text, tags) without breaking the reader.
    Decoded by msgspec a chunk at a time (:func:`jsonl_chunks`), with a checked path, line by line,
    that accepts and refuses the same lines and names what is wrong.
``mooncake``
    The Mooncake FAST'25 traces: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.
    ``shape`` is :func:`blocks_signature` of the first ``shape_blocks`` hash ids, ``model`` is
    ``default_model`` and ``id`` is the 0-based line index.
``azure``
    The Azure LLM inference 2023 CSVs: ``TIMESTAMP`` (``YYYY-MM-DD HH:MM:SS.fffffff``),
    ``ContextTokens``, ``GeneratedTokens``. ``t_ms`` is milliseconds since the first data row (floored),
    all rows share one shape per model (``shape_signature([f"azure:{model}"])``: the trace has no prefix
    information) and ``id`` is the 0-based data-row index.

Lines are UTF-8 (a BOM is dropped); blank lines are skipped but still counted, so
``TraceRecord.line`` always points at the source line. Every problem in the data raises
:class:`TraceError` with one line of the form ``file:line: message``. Opening files, gzip, order and
the shipped traces are processor.sim.traces.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from datetime import date
from typing import Annotated, Any, cast

import msgspec

from processor.core.serving import SEPARATOR
from processor.core.signature import blocks_signature, shape_signature

__all__ = ["TraceError", "TraceRecord", "decoded_lines", "iter_azure", "iter_mooncake", "jsonl_chunks"]

_U64 = (1 << 64) - 1


class TraceRecord(msgspec.Struct, frozen=True, gc=False):
    """One request from a trace.

    ``shape`` is an unsigned 64-bit signature, ``length`` the prompt tokens (> 0), ``output_length`` the
    generated tokens when the trace knows them, ``line`` the 1-based source line (for error reports and
    for finding the row again), ``job`` the job it belongs to ("" for none; token shares between jobs
    are docs/shares.md), ``adapter`` the LoRA adapter it asks for ("" for the base model).
    """

    t_ms: int
    model: str
    shape: int
    length: int
    id: str
    output_length: int | None
    line: int
    job: str = ""
    adapter: str = ""


class TraceError(ValueError):
    """A trace cannot be read; the message is one line naming the file and line (or the problem)."""


# --------------------------------------------------------------------------------------------- helpers


def _show(value: Any) -> str:
    """A short repr for error messages (a bad ``hash_ids`` list can be thousands of characters)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value: Any, key: str, where: str, *, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi]; bools and floats are rejected (``true`` is not a length)."""
    if type(value) is int and value >= lo and (hi is None or value <= hi):
        return value
    if hi == _U64:
        kind = "an unsigned 64-bit integer"
    elif lo == 1:
        kind = "a positive integer"
    elif lo == 0:
        kind = "a non-negative integer"
    else:
        kind = "an integer"
    raise TraceError(f'{where}: "{key}" must be {kind}, got {_show(value)}')


def _csv_int(text: str, key: str, where: str, *, lo: int) -> int:
    """A CSV cell as an int >= lo; only plain ASCII digits (``int()`` would also take ``" 1_0"``)."""
    if text.isascii() and text.isdigit():
        value = int(text)
        if value >= lo:
            return value
    kind = "a positive integer" if lo == 1 else "a non-negative integer"
    raise TraceError(f'{where}: "{key}" must be {kind}, got {_show(text)}')


def decoded_lines(stream: io.BufferedIOBase, name: str, state: list[int]) -> Iterator[str]:
    """Decode line by line (not in 8 KiB chunks as text mode does) so a bad byte names its own line.

    ``state[0]`` is the last line number read, to place gzip errors; a UTF-8 BOM is dropped.
    """
    for lineno, raw in enumerate(stream, 1):
        state[0] = lineno
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{name}:{lineno}: not valid UTF-8 text (byte {exc.start + 1} of the line)"
            ) from None
        yield text[1:] if lineno == 1 and text.startswith("\ufeff") else text


# ----------------------------------------------------------------------------------------- format parsers


def _parse_json_line(text: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


class _JsonlRow(msgspec.Struct, gc=False):
    """One native line as msgspec decodes it: a line it refuses (or that needs a rule msgspec does not
    express, such as "exactly one of shape or components") goes to the checked path below, which
    gives the error its one-line message, so both paths accept and refuse the same lines."""

    t_ms: Annotated[int, msgspec.Meta(ge=-(1 << 63))]
    model: Annotated[str, msgspec.Meta(min_length=1)]
    length: Annotated[int, msgspec.Meta(ge=1)]
    shape: int | msgspec.UnsetType = msgspec.UNSET  # checked in [0, 2^64) below (msgspec bounds are int64)
    components: list[str] | msgspec.UnsetType = msgspec.UNSET
    id: str | None = None
    output_length: Annotated[int, msgspec.Meta(ge=0)] | None = None
    job: str = ""
    adapter: str = ""


_JSONL_DECODER = msgspec.json.Decoder(_JsonlRow)
_BOM = "\ufeff".encode()


_CHUNK_BYTES = 1 << 17
"""The fast path decodes this much of the file at a time (whole lines), in one msgspec call."""


def jsonl_chunks(stream: io.BufferedIOBase, name: str, state: list[int]) -> Iterator[list[TraceRecord]]:
    """The native format, decoded by msgspec straight from the bytes, ``_CHUNK_BYTES`` of whole lines
    per call (about 6x ``json.loads`` and the checks in Python), a list of records per chunk. A chunk
    msgspec refuses, or one with a blank line or a row msgspec cannot check alone, is read line by
    line instead, each line by :func:`_iter_jsonl_lines` (a list per line, so the lines before a bad
    one still arrive): both paths accept and refuse the same lines with the same messages."""
    decode_lines = _JSONL_DECODER.decode_lines
    cache: dict[tuple[str, ...], int] = {}
    shared: _Shared = ({}, {})
    first = 1  # the line number of the chunk's first line
    rest = b""
    at_start = True  # a BOM may still come
    while True:
        block = stream.read(_CHUNK_BYTES)
        data = rest + block
        if at_start and (len(data) >= len(_BOM) or not block):
            at_start = False
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        cut = data.rfind(b"\n") + 1 if block else len(data)
        if at_start or cut == 0:  # no newline yet: a line longer than the chunk, or the file's start
            if not block:
                return
            rest = data
            continue
        chunk, rest = data[:cut], data[cut:]
        n_lines = chunk.count(b"\n") + (not chunk.endswith(b"\n"))
        try:
            rows = decode_lines(chunk)
        except (msgspec.DecodeError, UnicodeDecodeError):
            rows = None
        records = None if rows is None or len(rows) != n_lines else _checked_rows(rows, first, cache, shared)
        if records is None:
            lines = chunk.split(b"\n")[:n_lines]  # split as the file's lines are counted: at b"\n" only
            for record in _iter_jsonl_lines(lines, first, name, state, cache, shared):
                yield [record]
        else:
            yield records
        first += n_lines
        state[0] = first - 1
        if not block:
            return


def _checked_rows(
    rows: list[_JsonlRow], first: int, cache: dict[tuple[str, ...], int], shared: _Shared
) -> list[TraceRecord] | None:
    """``rows`` (lines ``first``...) as records, or None if one needs the checked path's message.

    Models, shapes and lengths repeat from line to line, and msgspec decodes each occurrence into
    an object of its own: the records share one object per distinct value instead (``shared``, kept
    for the read), which cuts what a million records hold by a fifth and keeps the values the
    scheduler reads on every item in a few hot objects."""
    unset = msgspec.UNSET
    out: list[TraceRecord] = []
    append = out.append
    models, ints = shared
    for lineno, row in enumerate(rows, first):
        shape = row.shape
        if shape is unset:
            if row.components is unset:
                return None
            ckey = tuple(cast(list[str], row.components))
            shape = cache.get(ckey, -1)
            if shape < 0:
                shape = cache[ckey] = shape_signature(ckey)
        elif row.components is not unset or not 0 <= shape <= _U64:
            return None
        rid = str(lineno - 1) if row.id is None else row.id
        model = _shared_name(models, row.model)
        adapter = _shared_name(models, row.adapter) if row.adapter else ""
        if model is None or adapter is None:
            return None
        shape = ints.setdefault(cast(int, shape), cast(int, shape))
        length = ints.setdefault(row.length, row.length)
        append(TraceRecord(row.t_ms, model, shape, length, rid, row.output_length, lineno, row.job, adapter))
    if len(ints) + len(models) > _SHARED_MAX:  # mostly distinct values: start afresh, stay bounded
        ints.clear()
        models.clear()
    return out


def _shared_name(names: dict[str, str], name: str) -> str | None:
    """``name`` as the one object ``names`` keeps for it, or None when it holds the serving key's
    separator (the checked path names the problem). The check runs once per distinct name."""
    shared = names.get(name)
    if shared is None:
        if SEPARATOR in name:
            return None
        shared = names[name] = name
    return shared


_Shared = tuple[dict[str, str], dict[int, int]]
"""One object per distinct model, and per distinct shape or length, seen in a read (``_checked_rows``)."""
_SHARED_MAX = 1 << 16


def _iter_jsonl_lines(
    lines: list[bytes],
    first: int,
    name: str,
    state: list[int],
    cache: dict[tuple[str, ...], int],
    shared: _Shared,
) -> Iterator[TraceRecord]:
    """One chunk line by line: msgspec per line, the checked path for a line it refuses."""
    decode = _JSONL_DECODER.decode
    for lineno, raw in enumerate(lines, first):
        state[0] = lineno
        try:
            rows = [decode(raw)]
        except (msgspec.DecodeError, UnicodeDecodeError):
            rows = None
        records = None if rows is None else _checked_rows(rows, lineno, cache, shared)
        if records is not None:
            yield from records
        elif raw.strip():
            yield from _iter_jsonl(_lines_from(raw, lineno, name), name, first=lineno)


def _lines_from(raw: bytes, lineno: int, name: str) -> Iterator[str]:
    """One raw line as :func:`decoded_lines` would decode it (the checked path names a bad byte)."""
    try:
        yield raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{name}:{lineno}"
        raise TraceError(f"{where}: not valid UTF-8 text (byte {exc.start + 1} of the line)") from None


def _iter_jsonl(lines: Iterable[str], name: str, first: int = 1) -> Iterator[TraceRecord]:
    cache: dict[tuple[str, ...], int] = {}
    for lineno, text in enumerate(lines, first):
        if not text.strip():
            continue
        where = f"{name}:{lineno}"
        obj = _parse_json_line(text, where)
        for key in ("t_ms", "model", "length"):
            if key not in obj:
                raise TraceError(f'{where}: missing field "{key}"')
        t_ms = _int(obj["t_ms"], "t_ms", where, lo=-(1 << 63))
        model = obj["model"]
        if type(model) is not str or not model:
            raise TraceError(f'{where}: "model" must be a non-empty string, got {_show(model)}')
        adapter = obj.get("adapter", "")
        if type(adapter) is not str:
            raise TraceError(f'{where}: "adapter" must be a string, got {_show(adapter)}')
        for key, value in (("model", model), ("adapter", adapter)):
            if SEPARATOR in value:
                raise TraceError(
                    f'{where}: "{key}" must not contain "{SEPARATOR}" (it joins model and adapter), '
                    f"got {_show(value)}"
                )
        length = _int(obj["length"], "length", where, lo=1)
        has_shape, has_components = "shape" in obj, "components" in obj
        if has_shape == has_components:
            raise TraceError(f'{where}: exactly one of "shape" or "components" is required')
        if has_shape:
            shape = _int(obj["shape"], "shape", where, lo=0, hi=_U64)
        else:
            components = obj["components"]
            if type(components) is not list or not all(type(c) is str for c in components):
                raise TraceError(f'{where}: "components" must be a list of strings, got {_show(components)}')
            ckey = tuple(components)
            shape = cache.get(ckey, -1)
            if shape < 0:
                shape = cache[ckey] = shape_signature(ckey)
        rid = obj.get("id")
        if rid is None:
            rid = str(lineno - 1)
        elif type(rid) is not str:
            raise TraceError(f'{where}: "id" must be a string, got {_show(rid)}')
        out = obj.get("output_length")
        if out is not None:
            out = _int(out, "output_length", where, lo=0)
        job = obj.get("job", "")
        if type(job) is not str:
            raise TraceError(f'{where}: "job" must be a string, got {_show(job)}')
        yield TraceRecord(t_ms, model, shape, length, rid, out, lineno, job, adapter)


def iter_mooncake(lines: Iterable[str], name: str, shape_blocks: int, model: str) -> Iterator[TraceRecord]:
    cache: dict[tuple[int, ...], int] = {}
    for lineno, text in enumerate(lines, 1):
        if not text.strip():
            continue
        where = f"{name}:{lineno}"
        obj = _parse_json_line(text, where)
        for key in ("timestamp", "input_length", "hash_ids"):
            if key not in obj:
                raise TraceError(f'{where}: missing field "{key}"')
        t_ms = _int(obj["timestamp"], "timestamp", where, lo=-(1 << 63))
        length = _int(obj["input_length"], "input_length", where, lo=1)
        out = obj.get("output_length")
        if out is not None:
            out = _int(out, "output_length", where, lo=0)
        hash_ids = obj["hash_ids"]
        if type(hash_ids) is not list:
            raise TraceError(f'{where}: "hash_ids" must be a list of integers, got {_show(hash_ids)}')
        prefix = tuple(hash_ids[:shape_blocks])
        for block in prefix:  # checked before the cache: (True,) == (1,) would otherwise slip through
            if type(block) is not int or block < 0:
                raise TraceError(f'{where}: "hash_ids" must hold non-negative integers, got {_show(block)}')
        shape = cache.get(prefix, -1)
        if shape < 0:
            shape = cache[prefix] = blocks_signature(prefix)
        yield TraceRecord(t_ms, model, shape, length, str(lineno - 1), out, lineno)


_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?")


def iter_azure(lines: Iterable[str], name: str, model: str) -> Iterator[TraceRecord]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{name}:1: empty file, expected a TIMESTAMP,ContextTokens,GeneratedTokens header")
    columns = [h.strip() for h in header]
    try:
        i_ts, i_in, i_out = (columns.index(c) for c in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    except ValueError:
        raise TraceError(
            f"{name}:{reader.line_num}: header must name TIMESTAMP, ContextTokens and GeneratedTokens, "
            f"got {_show(header)}"
        ) from None
    width = len(columns)
    shape = shape_signature([f"azure:{model}"])
    ordinals: dict[str, int] = {}  # date string -> day ordinal; a trace spans one or two days
    first: int | None = None
    index = 0
    for row in reader:
        lineno = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        where = f"{name}:{lineno}"
        if len(row) != width:
            raise TraceError(f"{where}: expected {width} columns, got {len(row)}")
        stamp = row[i_ts].strip()
        m = _TIMESTAMP.fullmatch(stamp)
        day = ordinals.get(m.group(1), -1) if m else -1
        if m and day < 0:
            try:
                day = ordinals[m.group(1)] = date.fromisoformat(m.group(1)).toordinal()
            except ValueError:
                day = -1
        if not m or day < 0 or int(m.group(2)) > 23 or int(m.group(3)) > 59 or int(m.group(4)) > 59:
            raise TraceError(
                f'{where}: "TIMESTAMP" must look like YYYY-MM-DD HH:MM:SS.fffffff, got {_show(stamp)}'
            )
        seconds = ((day * 24 + int(m.group(2))) * 60 + int(m.group(3))) * 60 + int(m.group(4))
        ticks = seconds * 10_000_000 + int((m.group(5) or "0").ljust(7, "0"))  # 100 ns units, exact
        if first is None:
            first = ticks
        length = _csv_int(row[i_in].strip(), "ContextTokens", where, lo=1)
        out = _csv_int(row[i_out].strip(), "GeneratedTokens", where, lo=0)
        yield TraceRecord((ticks - first) // 10_000, model, shape, length, str(index), out, lineno)
        index += 1
