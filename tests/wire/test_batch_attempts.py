"""A Batch says which attempt each item is on (``Batch.attempts``), and a batch of first attempts is
written exactly as before the field existed, so consumer apps not yet upgraded read it
(processor/wire/items.py, docs/wire-format.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import PRE_ATTEMPTS_BATCH
from processor.wire.heads import decode_batch_head
from processor.wire.items import decode_batch, encode_batch, encode_batch_record
from processor.wire.schemas import BATCH_HEADER, HEADER_SIZE, HEADERS, PRE_ATTEMPTS_BATCH_HEADER
from tests.wire.golden_values import BATCH, FIRST_ATTEMPT_BATCH
from tests.wire.helpers import BATCH_ITEMS, batch_records, fastavro_batch, fastavro_message, make_batch

GOLDEN = Path(__file__).resolve().parents[2] / "schemas" / "golden"
BATCH_HEADER_BEFORE_ATTEMPTS = "c301b4051a14a67e6924"
"""The Batch header docs/wire-format.md listed before ``attempts`` existed."""


def golden_batch(name: str) -> bytes:
    records = json.loads((GOLDEN / name).read_text(encoding="utf-8"))["records"]
    (rec,) = [r for r in records if r["record"] == "Batch" and "request" in r["canonical_form"]]
    return bytes.fromhex(rec["message_hex"])


def test_a_batch_of_first_attempts_is_the_message_of_before_attempts() -> None:
    """The previous.json batch is the current golden one less its ``attempts`` (the last bytes) under
    the header of before: the processor writes the same bytes as before while no item is retried."""
    current, before = golden_batch("messages.json"), golden_batch("previous.json")
    assert current[:HEADER_SIZE] == BATCH_HEADER == HEADERS["Batch"]
    assert before[:HEADER_SIZE].hex() == PRE_ATTEMPTS_BATCH_HEADER.hex() == BATCH_HEADER_BEFORE_ATTEMPTS
    attempts_tail = bytes([4, 4, 2, 0])  # an array of two ints, 2 and 1, and its end
    assert current.endswith(attempts_tail)
    assert before == PRE_ATTEMPTS_BATCH_HEADER + current[HEADER_SIZE : -len(attempts_tail)]
    assert encode_batch_record(FIRST_ATTEMPT_BATCH) == before
    assert encode_batch_record(BATCH) == current


def test_every_reader_reads_each_items_attempt() -> None:
    current, before = golden_batch("messages.json"), golden_batch("previous.json")
    assert decode_batch(current).attempts == [2, 1]
    assert [decode_batch(current).attempt(i) for i in range(2)] == [2, 1]
    assert list(decode_batch_head(current).attempts) == [2, 1]
    assert decode_batch(before) == FIRST_ATTEMPT_BATCH
    assert [decode_batch(before).attempt(i) for i in range(2)] == [1, 1]
    assert list(decode_batch_head(before).attempts) == []
    assert PRE_ATTEMPTS_BATCH.decode(before)["attempts"] == []


def test_the_processor_writes_attempts_only_when_an_item_is_retried() -> None:
    batch = make_batch(BATCH_ITEMS)
    assert encode_batch(batch)[:HEADER_SIZE] == PRE_ATTEMPTS_BATCH_HEADER
    batch.items[2].attempt = 3
    value = encode_batch(batch)
    assert value[:HEADER_SIZE] == BATCH_HEADER
    assert decode_batch(value).attempts == [1, 1, 3]
    assert decode_batch(value) == batch_records(batch)


@pytest.mark.parametrize("attempts", [[1, 2], [0, 1, 1], [2, -1, 1]], ids=["too-few", "zero", "negative"])
def test_attempts_that_do_not_fit_the_items_are_malformed(attempts: list[int]) -> None:
    rec = decode_batch(encode_batch(make_batch(BATCH_ITEMS)))
    fields = PRE_ATTEMPTS_BATCH.decode(fastavro_batch(rec))  # the raw Avro values, shape signed
    forged = fastavro_message("Batch", {**fields, "attempts": attempts})
    for decode in (decode_batch, decode_batch_head):
        with pytest.raises(DecodeError) as err:
            decode(forged)
        assert err.value.reason == "avro-decode"
    with pytest.raises(ValueError, match="attempts"):
        encode_batch_record(dataclasses.replace(rec, attempts=attempts))


@given(st.lists(st.integers(1, 5), min_size=3, max_size=3))
def test_any_attempts_round_trip_as_fastavro_writes_them(attempts: list[int]) -> None:
    batch = make_batch(BATCH_ITEMS)
    for it, attempt in zip(batch.items, attempts, strict=True):
        it.attempt = attempt
    value = encode_batch(batch)
    assert value == fastavro_batch(batch_records(batch))
    assert [decode_batch(value).attempt(i) for i in range(3)] == attempts
