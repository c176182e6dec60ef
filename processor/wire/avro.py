"""Avro binary primitives, written by hand: zigzag varints, strings, bytes, blocks, unions.

The readers take ``(buf, pos)`` and return ``(value, next_pos)``; they raise :class:`Malformed` (or
``IndexError`` at the end of the buffer) and never ``DecodeError``: the record decoders above them turn
those into one ``avro-decode`` reason. The encoders refuse, with ``ValueError``, a value its Avro type
cannot hold, naming the field.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from processor.wire.errors import Malformed

T = TypeVar("T")

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def read_long_slow(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos``, any length (callers inline the one-byte case).

    Unrolled: about twice as fast as a loop for the 6-10 byte timestamps and signatures that every
    item carries. A varint longer than 10 bytes or wider than 64 bits is malformed.
    """
    b = buf[pos]
    n = b & 0x7F
    if b >= 0x80:
        b = buf[pos + 1]
        n |= (b & 0x7F) << 7
        if b < 0x80:
            pos += 1
        else:
            b = buf[pos + 2]
            n |= (b & 0x7F) << 14
            if b < 0x80:
                pos += 2
            else:
                b = buf[pos + 3]
                n |= (b & 0x7F) << 21
                if b < 0x80:
                    pos += 3
                else:
                    n, pos = _read_long_tail(buf, pos + 4, n)
                    return (n >> 1) ^ -(n & 1), pos
    return (n >> 1) ^ -(n & 1), pos + 1


def _read_long_tail(buf: bytes, pos: int, n: int) -> tuple[int, int]:
    """Bytes 5-10 of a varint whose first four (value ``n``) all had the continuation bit."""
    b = buf[pos]
    n |= (b & 0x7F) << 28
    if b < 0x80:
        return n, pos + 1
    b = buf[pos + 1]
    n |= (b & 0x7F) << 35
    if b < 0x80:
        return n, pos + 2
    b = buf[pos + 2]
    n |= (b & 0x7F) << 42
    if b < 0x80:
        return n, pos + 3
    b = buf[pos + 3]
    n |= (b & 0x7F) << 49
    if b < 0x80:
        return n, pos + 4
    b = buf[pos + 4]
    n |= (b & 0x7F) << 56
    if b < 0x80:
        return n, pos + 5
    b = buf[pos + 5]
    if b > 1:
        raise Malformed("varint longer than 10 bytes or wider than 64 bits")
    return n | (b << 63), pos + 6


_CONTINUED = bytes(range(0x80, 0x100))  # the bytes of a varint that has more bytes after them


def skip_long(buf: bytes, pos: int) -> int:
    """The position after the varint at ``pos``, checked as :func:`_read_long_slow` checks it but not
    decoded: for fields the processor's hot path validates and never reads (``produced_ms``)."""
    raw = buf[pos : pos + 10]
    more = len(raw) - len(raw.lstrip(_CONTINUED))
    if more == len(raw) or (more == 9 and raw[9] > 1):
        raise Malformed("varint runs past the end, or is longer than 10 bytes or wider than 64 bits")
    return pos + more + 1


# Shape signatures are hashes, so nearly every one is a 9- or 10-byte varint, the slow path: read each
# distinct encoding once and look it up by its bytes after that. A 10-byte key ending the varint can
# only be that varint (the first nine bytes carry continuation bits, the tenth does not), and the
# same holds for 9-byte keys; the dictionaries are bounded, past that the varint is decoded.
_SIGNATURES_10: dict[bytes, int] = {}

_SIGNATURES_9: dict[bytes, int] = {}

_MAX_SIGNATURES = 1 << 16

U64 = 0xFFFFFFFFFFFFFFFF


def read_signature(buf: bytes, pos: int) -> tuple[int, int]:
    """A shape signature (an Avro long) as the unsigned 64-bit int, one shared object per signature."""
    raw = buf[pos : pos + 10]
    shape = _SIGNATURES_10.get(raw)
    if shape is not None:
        return shape, pos + 10
    shape = _SIGNATURES_9.get(raw[:9])
    if shape is not None:
        return shape, pos + 9
    n, end = read_long_slow(buf, pos)
    shape = n & U64
    if end - pos == 10 and len(_SIGNATURES_10) < _MAX_SIGNATURES:
        _SIGNATURES_10[raw] = shape
    elif end - pos == 9 and len(_SIGNATURES_9) < _MAX_SIGNATURES:
        _SIGNATURES_9[raw[:9]] = shape
    return shape, end


def read_long(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    return read_long_slow(buf, pos)


def read_int(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    n, pos = read_long_slow(buf, pos)
    if not INT_MIN <= n <= INT_MAX:
        raise Malformed(f"int field out of 32-bit range: {n}")
    return n, pos


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    b = buf[pos]
    if b < 0x80:
        n = (b >> 1) ^ -(b & 1)
        pos += 1
    else:
        n, pos = read_long_slow(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise Malformed(f"length {n} at offset {pos} runs past the end ({len(buf)} bytes)")
    return buf[pos:end], end


def read_str(buf: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _read_bytes(buf, pos)
    return raw.decode("utf-8"), pos


def read_block_count(buf: bytes, pos: int) -> tuple[int, int]:
    """An array/map block count; a negative count is followed by the block's byte size (skipped)."""
    count, pos = read_long(buf, pos)
    if count < 0:
        count = -count
        _size, pos = read_long(buf, pos)
    return count, pos


def read_union_index(buf: bytes, pos: int) -> tuple[int, int]:
    index, pos = read_long(buf, pos)
    if index not in (0, 1):
        raise Malformed(f"union branch {index} does not exist")
    return index, pos


def _read_array(
    buf: bytes, pos: int, read: Callable[[bytes, int], tuple[T, int]]
) -> tuple[tuple[T, ...], int]:
    """An Avro array whose items ``read`` reads, as a tuple."""
    items: list[T] = []
    count, pos = read_block_count(buf, pos)
    while count:
        for _ in range(count):
            item, pos = read(buf, pos)
            items.append(item)
        count, pos = read_block_count(buf, pos)
    return tuple(items), pos


def read_str_array(buf: bytes, pos: int) -> tuple[tuple[str, ...], int]:
    return _read_array(buf, pos, read_str)


def read_int_array(buf: bytes, pos: int) -> tuple[tuple[int, ...], int]:
    return _read_array(buf, pos, read_int)


_DOUBLE = struct.Struct("<d")


def read_double(buf: bytes, pos: int) -> tuple[float, int]:
    """An Avro double: eight bytes, little-endian IEEE 754."""
    end = pos + 8
    if end > len(buf):
        raise Malformed(f"double at offset {pos} runs past the end ({len(buf)} bytes)")
    return _DOUBLE.unpack_from(buf, pos)[0], end


def encode_double(x: float) -> bytes:
    return _DOUBLE.pack(x)


def read_str_map(buf: bytes, pos: int) -> tuple[dict[str, str], int]:
    result: dict[str, str] = {}
    count, pos = read_block_count(buf, pos)
    while count:
        for _ in range(count):
            key, pos = read_str(buf, pos)
            result[key], pos = read_str(buf, pos)
        count, pos = read_block_count(buf, pos)
    return result, pos


_SMALL = [bytes([n << 1]) for n in range(64)]  # zigzag of 0..63 is one byte: 2n


def encode_long(n: int, field: str = "") -> bytes:
    """Zigzag varint of a signed 64-bit ``n`` (``field`` names it in the error when it does not fit)."""
    if 0 <= n < 64:
        return _SMALL[n]
    if not LONG_MIN <= n <= LONG_MAX:
        raise ValueError(
            f"{field}={n} does not fit an Avro long" if field else f"{n} does not fit an Avro long"
        )
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_int(n: int, field: str) -> bytes:
    if not INT_MIN <= n <= INT_MAX:
        raise ValueError(f"{field}={n} does not fit an Avro int")
    return encode_long(n)


def encode_bytes(raw: bytes) -> bytes:
    return encode_long(len(raw)) + raw


def encode_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return encode_long(len(raw)) + raw
