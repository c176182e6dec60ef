"""The records and their helpers (processor/wire/records.py): token bytes, a new item's shape, and a
CompletionBatch built from completions of one batch."""

from __future__ import annotations

import pytest

from processor.core.signature import shape_signature
from processor.wire.records import (
    CompletionBatchRecord,
    ids_from_tokens,
    new_token_item,
    tokens_from_ids,
    verify_shape,
)
from tests.wire.helpers import batch_of, completion_rec, item

# ------------------------------------------------------------------------------------------------
# tokens helpers


def test_tokens_are_little_endian_uint32() -> None:
    assert tokens_from_ids([1, 0x01020304]) == b"\x01\x00\x00\x00\x04\x03\x02\x01"
    assert list(ids_from_tokens(b"\x01\x00\x00\x00\x04\x03\x02\x01")) == [1, 0x01020304]
    ids = ids_from_tokens(tokens_from_ids(range(1000)))
    assert ids.itemsize == 4 and list(ids) == list(range(1000))


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_tokens_from_ids_refuses_ids_outside_uint32(bad: int) -> None:
    with pytest.raises(ValueError, match="uint32"):
        tokens_from_ids([1, bad])


def test_ids_from_tokens_refuses_a_partial_id() -> None:
    with pytest.raises(ValueError):
        ids_from_tokens(b"\x00\x00\x00")


def test_new_token_item_computes_the_shape_from_components() -> None:
    rec = new_token_item("a", "m", [5, 6], 10, shape_components=["sys", "few-shot"])
    assert rec.shape == shape_signature(["sys", "few-shot"])
    assert rec.token_count == 2 and list(rec.token_ids()) == [5, 6]
    assert verify_shape(rec) is True
    assert verify_shape(item(shape=1)) is False
    assert verify_shape(item(shape_components=None)) is None
    assert new_token_item("a", "m", [1], 0).shape == shape_signature([])


def test_completion_batch_takes_its_fields_from_completions_of_one_batch() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CompletionBatchRecord.of([])
    with pytest.raises(ValueError, match=r"'item-2': batch_id='b-2', its batch's first completion has 'b-1'"):
        batch_of(completion_rec(), completion_rec(item_id="item-2", batch_id="b-2"))
    with pytest.raises(ValueError, match="engine_ms"):
        batch_of(completion_rec(), completion_rec(item_id="item-2", engine_ms=1))
