"""The hand-written Avro primitives (processor/wire/avro.py), through the TokenItem decoders: blocks,
varints and unions as the spec allows them, and nothing it does not."""

from __future__ import annotations

import pytest

from processor.wire.items import decode_token_item, encode_token_item
from tests.wire.helpers import ITEM_DECODERS, item, reason_of


def test_negative_block_counts_are_accepted() -> None:
    """The spec lets a writer send -count then the block's byte size (Java's blocking encoder does)."""
    plain = encode_token_item(item(shape_components=("ab", "c"), metadata=None))
    # shape_components: branch 1 (\x02), count 2 (\x04), "ab", "c", end (\x00)
    assert b"\x02\x04\x04ab\x02c\x00" in plain
    blocked = plain.replace(b"\x02\x04\x04ab\x02c\x00", b"\x02\x03\x0a\x04ab\x02c\x00")
    for decoder in ITEM_DECODERS:
        assert decoder(blocked) == decoder(plain)


def test_non_minimal_varints_are_accepted() -> None:
    """Avro readers accept padded varints; a null branch written as 0x80 0x00 is still null."""
    plain = encode_token_item(item(output_budget=None, metadata=None))
    assert plain.endswith(b"\x00\x00")
    padded = plain[:-1] + b"\x80\x00"
    for decoder in ITEM_DECODERS:
        assert decoder(padded) == item(output_budget=None, metadata=None)


@pytest.mark.parametrize(
    ("varint", "decodes"),
    [
        (b"\xff" * 9 + b"\x01", True),  # the largest 10-byte varint: zigzag 2**64 - 1
        (b"\xff" * 9 + b"\x02", False),  # wider than 64 bits
        (b"\xff" * 10 + b"\x00", False),  # 11 bytes
    ],
)
def test_overlong_varints_are_rejected(varint: bytes, decodes: bool) -> None:
    value = encode_token_item(item(produced_ms=-(1 << 63)))
    assert b"\xff" * 9 + b"\x01" in value
    changed = value.replace(b"\xff" * 9 + b"\x01", varint)
    if decodes:
        assert decode_token_item(changed).produced_ms == -(1 << 63)
    else:
        assert reason_of(decode_token_item, changed) == "avro-decode"


def test_int_fields_out_of_32_bit_range_are_rejected() -> None:
    plain = encode_token_item(item(output_budget=None, metadata=None))
    assert plain.endswith(b"\x00\x00\x00")  # output_budget, metadata and request null
    budget_2_31 = plain[:-3] + b"\x02" + b"\x80\x80\x80\x80\x10" + b"\x00\x00"  # zigzag(2**31) = 2**32
    budget_max = plain[:-3] + b"\x02" + b"\xfe\xff\xff\xff\x0f" + b"\x00\x00"  # zigzag(2**31 - 1)
    for decoder in ITEM_DECODERS:
        assert reason_of(decoder, budget_2_31) == "avro-decode"
        assert decoder(budget_max).output_budget == (1 << 31) - 1


def test_negative_union_index_is_rejected() -> None:
    """fastavro reads union index -1 as the last branch; the spec (and this codec) says malformed."""
    plain = encode_token_item(item(metadata=None))
    assert plain.endswith(b"\x00")
    assert reason_of(decode_token_item, plain[:-1] + b"\x01\x00") == "avro-decode"
