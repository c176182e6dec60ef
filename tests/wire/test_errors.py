"""Decode errors (processor/wire/errors.py): every decoder refuses with a named reason, and random
bytes raise DecodeError and nothing else."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.wire.completions import decode_completion, decode_completion_batch, decode_completions
from processor.wire.control import decode_contract, decode_dead_letter, decode_ledger_snapshot
from processor.wire.errors import DecodeError
from processor.wire.items import encode_token_item
from processor.wire.schemas import HEADERS, RECORD_NAMES
from tests.wire.helpers import OTHER_DECODERS, item, only_decode_errors, reason_of


def test_decode_error_carries_reason_and_pickles() -> None:
    err = DecodeError("bad-magic", "no header")
    assert isinstance(err, ValueError) and err.reason == "bad-magic" and str(err) == "no header"
    copy = pickle.loads(pickle.dumps(err))
    assert copy.reason == "bad-magic" and str(copy) == "no header"


@pytest.mark.parametrize("decoder", OTHER_DECODERS)
def test_other_records_reject_like_token_items(decoder: Any) -> None:
    name = {
        decode_completion: "Completion",
        decode_completion_batch: "CompletionBatch",
        decode_completions: "CompletionBatch",
        decode_contract: "ConsumerContract",
        decode_ledger_snapshot: "LedgerSnapshot",
        decode_dead_letter: "DeadLetter",
    }[decoder]
    assert reason_of(decoder, b"nope") == "bad-magic"
    assert reason_of(decoder, encode_token_item(item())) == "unknown-schema"
    assert reason_of(decoder, HEADERS[name]) == "avro-decode"
    assert reason_of(decoder, HEADERS[name] + b"\x7f") == "avro-decode"


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(value: bytes) -> None:
    only_decode_errors(value)


@settings(max_examples=500)
@given(st.sampled_from(RECORD_NAMES), st.binary(max_size=200))
def test_random_bodies_raise_only_decode_error(name: str, body: bytes) -> None:
    only_decode_errors(HEADERS[name] + body)
