"""``TokenItem.request`` (a :class:`GenerationRequest`) in Avro binary, by hand, and from fastavro's dict.

Why a cache of whole requests by their bytes: the request is the last field of a ``TokenItem``, so in
an input message its bytes run from where it starts to the end of the message, and the items of one
job mostly ask the same thing (one job-wide setting, a few JSON schemas), so those bytes repeat. A
message whose request bytes were read before is answered from :func:`read_final_request`'s cache by
one dictionary lookup instead of thirteen fields and a JSON parse of its schema
(docs/benchmarks.md, "Ingest decode with a request"). That is sound because decoding is a function
of the bytes: the same bytes, read to the end of the message, give the same request and the same
verdict of :func:`~processor.wire.request.request_problem`. Requests that differ in every item (a
per-row seed) miss, and are read field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from processor.wire.avro import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    encode_double,
    encode_int,
    encode_long,
    encode_str,
    read_double,
    read_int,
    read_int_array,
    read_long,
    read_str,
    read_str_array,
    read_union_index,
)
from processor.wire.request import GenerationRequest, request_problem

# The fields in schema order (schemas/TokenItem.avsc, GenerationRequest); checked at import, as the
# reader below fills them in this order through the slots' descriptors (a frozen dataclass's
# __init__ costs twice as much).
_REQUEST_FIELDS = (
    "adapter", "priority", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "logprobs", "json_schema", "choices", "regex", "extra",
)  # fmt: skip

if tuple(f.name for f in fields(GenerationRequest)) != _REQUEST_FIELDS:  # pragma: no cover
    raise ImportError("request codec: GenerationRequest fields changed; update the schema and the codec")

_SETTERS = tuple(getattr(GenerationRequest, name).__set__ for name in _REQUEST_FIELDS)

_object_new = object.__new__

#: The int fields of a request that fastavro does not range-check (its writer takes any Python int).
_INT_FIELDS = ("priority", "top_k", "logprobs")


(
    _set_adapter, _set_priority, _set_temperature, _set_top_p, _set_top_k, _set_seed, _set_stop,
    _set_stop_token_ids, _set_logprobs, _set_json_schema, _set_choices, _set_regex, _set_extra,
) = _SETTERS  # fmt: skip


def _union_value(buf: bytes, pos: int, read: Callable[[bytes, int], tuple[Any, int]]) -> tuple[Any, int]:
    """A ``["null", X]`` union's value written other than as the bytes 00 or 02 (a non-minimal
    branch index): the index checked, then the value, or None for the null branch."""
    branch, pos = read_union_index(buf, pos)
    return read(buf, pos) if branch else (None, pos)


def read_request(buf: bytes, pos: int) -> tuple[GenerationRequest, int]:
    """The GenerationRequest record at ``pos`` (after its union branch) and the position after it.

    Raises what the readers raise on a malformed body (``processor.wire.errors.MALFORMED``).

    Unrolled, each field's usual encodings inline (a union's null branch is the byte 00 and its value
    branch 02, an empty array the byte 00), and the slots filled one by one: measured about twice as
    fast as a loop over the fields, which matters for requests read per item (a per-row seed).
    """
    adapter, pos = read_str(buf, pos)
    b = buf[pos]
    if b < 0x80:
        priority = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        priority, pos = read_int(buf, pos)
    b = buf[pos]
    if b == 0:
        temperature, pos = None, pos + 1
    elif b == 2:
        temperature, pos = read_double(buf, pos + 1)
    else:
        temperature, pos = _union_value(buf, pos, read_double)
    b = buf[pos]
    if b == 0:
        top_p, pos = None, pos + 1
    elif b == 2:
        top_p, pos = read_double(buf, pos + 1)
    else:
        top_p, pos = _union_value(buf, pos, read_double)
    b = buf[pos]
    if b == 0:
        top_k, pos = None, pos + 1
    elif b == 2:
        top_k, pos = read_int(buf, pos + 1)
    else:
        top_k, pos = _union_value(buf, pos, read_int)
    b = buf[pos]
    if b == 0:
        seed, pos = None, pos + 1
    elif b == 2:
        seed, pos = read_long(buf, pos + 1)
    else:
        seed, pos = _union_value(buf, pos, read_long)
    stop, pos = ((), pos + 1) if buf[pos] == 0 else read_str_array(buf, pos)
    stop_token_ids, pos = ((), pos + 1) if buf[pos] == 0 else read_int_array(buf, pos)
    b = buf[pos]
    if b == 0:
        logprobs, pos = None, pos + 1
    elif b == 2:
        logprobs, pos = read_int(buf, pos + 1)
    else:
        logprobs, pos = _union_value(buf, pos, read_int)
    json_schema, pos = (None, pos + 1) if buf[pos] == 0 else _union_value(buf, pos, read_str)
    choices, pos = ((), pos + 1) if buf[pos] == 0 else read_str_array(buf, pos)
    regex, pos = (None, pos + 1) if buf[pos] == 0 else _union_value(buf, pos, read_str)
    extra, pos = (None, pos + 1) if buf[pos] == 0 else _union_value(buf, pos, read_str)
    request = _object_new(GenerationRequest)
    _set_adapter(request, adapter)
    _set_priority(request, priority)
    _set_temperature(request, temperature)
    _set_top_p(request, top_p)
    _set_top_k(request, top_k)
    _set_seed(request, seed)
    _set_stop(request, stop)
    _set_stop_token_ids(request, stop_token_ids)
    _set_logprobs(request, logprobs)
    _set_json_schema(request, json_schema)
    _set_choices(request, choices)
    _set_regex(request, regex)
    _set_extra(request, extra)
    return request, pos


def read_request_field(buf: bytes, pos: int, final: bool) -> tuple[GenerationRequest | None, str | None, int]:
    """The ``request`` field (null or a request) at ``pos``: the request, its
    :func:`request_problem` (None: valid), and the position after it. ``final``: the field should
    end the message (an input message's), so its bytes are looked up before they are read."""
    if buf[pos] == 0:
        return None, None, pos + 1
    branch, pos = read_union_index(buf, pos)
    if not branch:
        return None, None, pos
    if final:
        return read_final_request(buf, pos)
    return read_checked_request(buf, pos)


_KNOWN: dict[bytes, tuple[GenerationRequest, str | None]] = {}
"""Requests by their exact bytes, with their problem (None: valid): one object and one check per
distinct request (module docstring)."""

_MAX_KNOWN = 2048
"""Entries in :data:`_KNOWN` before it is emptied (a job of per-row seeds fills it with misses)."""

_MAX_KNOWN_BYTES = 8192
"""Longer requests (a large JSON schema) are not kept: the cache holds at most 16 MiB of keys."""


def read_checked_request(buf: bytes, pos: int) -> tuple[GenerationRequest, str | None, int]:
    """The request record at ``pos`` (after its union branch), its :func:`request_problem`, and the
    position after it. Read field by field; checked once per distinct bytes."""
    request, end = read_request(buf, pos)
    key = buf[pos:end]
    known = _KNOWN.get(key)
    if known is not None:
        return known[0], known[1], end
    problem = request_problem(request)
    _remember(key, request, problem)
    return request, problem, end


def read_final_request(buf: bytes, pos: int) -> tuple[GenerationRequest, str | None, int]:
    """:func:`read_checked_request` of a request that should end the message: when the bytes from
    ``pos`` to the end are a request read before, that request, without reading it again. Otherwise
    the position after it may fall short of the end (the caller refuses the trailing bytes)."""
    key = buf[pos:]
    known = _KNOWN.get(key)
    if known is not None:
        return known[0], known[1], len(buf)
    request, end = read_request(buf, pos)
    problem = request_problem(request)
    if end == len(buf):  # else the bytes are not this request's alone: not kept
        _remember(key, request, problem)
    return request, problem, end


def _remember(key: bytes, request: GenerationRequest, problem: str | None) -> None:
    if len(key) <= _MAX_KNOWN_BYTES:
        if len(_KNOWN) >= _MAX_KNOWN:
            _KNOWN.clear()
        _KNOWN[key] = (request, problem)


def encode_request_field(request: GenerationRequest | None) -> bytes:
    """The ``request`` field's Avro binary: the null branch, or branch 1 and the record.

    Raises ``ValueError`` for a number its Avro type cannot hold (the caller refuses an invalid
    request first, with :func:`request_problem`'s reason)."""
    if request is None:
        return b"\x00"
    r = request
    out = [b"\x02", encode_str(r.adapter), encode_int(r.priority, "request.priority")]
    for value, encode in (
        (r.temperature, encode_double),
        (r.top_p, encode_double),
        (r.top_k, lambda n: encode_int(n, "request.top_k")),
        (r.seed, lambda n: encode_long(n, "request.seed")),
    ):
        out.append(b"\x00" if value is None else b"\x02" + encode(value))
    out.append(_str_array(r.stop))
    if r.stop_token_ids:
        out.append(encode_long(len(r.stop_token_ids)))
        out += (encode_int(t, "request.stop_token_ids") for t in r.stop_token_ids)
    out.append(b"\x00")
    out.append(b"\x00" if r.logprobs is None else b"\x02" + encode_int(r.logprobs, "request.logprobs"))
    out.append(_optional_str(r.json_schema))
    out.append(_str_array(r.choices))
    out += (_optional_str(r.regex), _optional_str(r.extra))
    return b"".join(out)


def _str_array(values: tuple[str, ...]) -> bytes:
    if not values:
        return b"\x00"
    return b"".join((encode_long(len(values)), *(encode_str(v) for v in values), b"\x00"))


def _optional_str(text: str | None) -> bytes:
    return b"\x00" if text is None else b"\x02" + encode_str(text)


def request_to_avro(request: GenerationRequest | None) -> dict[str, Any] | None:
    """The ``request`` field as fastavro's writer takes it (the reference encoding, golden files)."""
    if request is None:
        return None
    d = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    for name in ("stop", "stop_token_ids", "choices"):
        d[name] = list(d[name])
    return d


def request_from_avro(d: Mapping[str, Any] | None) -> GenerationRequest | None:
    """The ``request`` field as fastavro's reader gives it, as a :class:`GenerationRequest`.

    Raises ``ValueError`` for an int or long out of its range (fastavro reads a varint of any size;
    the hand-written reader refuses it as malformed)."""
    if d is None:
        return None
    for name in _INT_FIELDS:
        if d[name] is not None and not INT_MIN <= d[name] <= INT_MAX:
            raise ValueError(f"request.{name}={d[name]} does not fit an Avro int")
    if d["seed"] is not None and not LONG_MIN <= d["seed"] <= LONG_MAX:
        raise ValueError(f"request.seed={d['seed']} does not fit an Avro long")
    if any(not INT_MIN <= t <= INT_MAX for t in d["stop_token_ids"]):
        raise ValueError("request.stop_token_ids: an id does not fit an Avro int")
    values: dict[str, Any] = {
        name: tuple(d[name]) if isinstance(d[name], list) else d[name] for name in _REQUEST_FIELDS
    }
    return GenerationRequest(**values)
