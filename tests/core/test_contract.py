"""Contracts (processor/core/contract.py): what a consumer promises to accept, the arithmetic every
batch is measured with, and the check a consumer makes of each batch it receives."""

from __future__ import annotations

import pytest

from processor.core.contract import Contract, contract_violation, round_up
from processor.wire.records import BatchRecord, TokenItemRecord
from tests.apps.helpers import card_contract, outgoing_batch, received, token_record
from tests.core.helpers import make_contract


@pytest.mark.parametrize(
    ("length", "multiple", "expected"),
    [
        (1, 8, 8),  # never below one multiple
        (0, 8, 8),
        (7, 8, 8),
        (8, 8, 8),
        (9, 8, 16),
        (16, 8, 16),
        (17, 8, 24),
        (1000, 1, 1000),
        (1001, 64, 1024),
        (50_000, 64, 50_048),
    ],
)
def test_round_up(length: int, multiple: int, expected: int) -> None:
    assert round_up(length, multiple) == expected


def test_round_up_is_the_smallest_multiple_at_or_above_the_length() -> None:
    for multiple in (1, 3, 8, 64):
        for length in range(1, 300):
            r = round_up(length, multiple)
            assert r % multiple == 0 and r >= length and r - multiple < max(length, 1)


def test_batch_cost_is_items_times_the_padded_longest_item() -> None:
    c = make_contract(budget=4096, pad=8)
    assert c.padded_length(1001) == 1008
    assert c.batch_cost(1, 1001) == 1008
    assert c.batch_cost(4, 1001) == 4 * 1008
    assert c.batch_cost(3, 1024) == 3 * 1024


def test_an_item_is_oversized_only_when_it_alone_exceeds_the_budget_after_padding() -> None:
    c = make_contract(budget=1000, pad=8)
    assert c.padded_length(993) == 1000 and not c.is_oversized(993)
    assert c.padded_length(1000) == 1000 and not c.is_oversized(1000)
    assert c.padded_length(1001) == 1008 and c.is_oversized(1001)
    odd = make_contract(budget=1001, pad=8)  # a budget that is not a multiple of the padding
    assert odd.is_oversized(1001)  # 1001 tokens pad to 1008 > 1001


def test_oversized_boundary_is_the_budget_itself() -> None:
    c = make_contract(budget=1024, pad=8)
    assert not c.is_oversized(1024)
    assert c.is_oversized(1025)  # pads to 1032
    unpadded = make_contract(budget=1000, pad=1)
    assert not unpadded.is_oversized(1000)
    assert unpadded.is_oversized(1001)


def test_a_valid_contract_keeps_its_numbers_and_defaults() -> None:
    c = Contract("card-16.a_1", "llama", budget_tokens=16384, max_items=64)
    assert (c.pad_multiple, c.max_inflight) == (8, 2)
    assert c.consumer == "card-16.a_1"


@pytest.mark.parametrize("consumer", ["", "has space", "slash/name", "x" * 201, "ümlaut", "colon:name"])
def test_consumer_id_must_be_a_topic_safe_name(consumer: str) -> None:
    with pytest.raises(ValueError, match="consumer id"):
        make_contract(consumer)


def test_consumer_id_of_200_characters_is_accepted() -> None:
    assert make_contract("x" * 200).consumer == "x" * 200


def test_model_must_not_be_empty() -> None:
    with pytest.raises(ValueError, match="model must not be empty"):
        make_contract(model="")


@pytest.mark.parametrize("field", ["budget", "items", "pad", "inflight"])
@pytest.mark.parametrize("value", [0, -1, 2.5, "8"])
def test_every_number_must_be_a_positive_integer(field: str, value: object) -> None:
    names = {
        "budget": "budget_tokens",
        "items": "max_items",
        "pad": "pad_multiple",
        "inflight": "max_inflight",
    }
    with pytest.raises(ValueError, match=f"{names[field]} must be a positive integer"):
        make_contract(**{field: value})  # type: ignore[arg-type]


def test_contracts_are_frozen() -> None:
    c = make_contract()
    with pytest.raises(AttributeError):
        c.budget_tokens = 1  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------
# contract_violation: the check a consumer makes of each batch it receives


def test_contract_violation_names_what_is_wrong() -> None:
    c = card_contract(budget=256, items=2)

    def batch(records: list[TokenItemRecord], padded_length: int, consumer: str = "card-a") -> BatchRecord:
        return received(outgoing_batch("b", consumer, records, padded_length=padded_length))

    ok = batch([token_record("i1", 100, 1), token_record("i2", 120, 1)], 128)
    assert contract_violation(c, ok) is None
    three = batch([token_record(f"i{n}", 10, 1) for n in range(3)], 16)
    assert "3 items > contract max_items 2" in str(contract_violation(c, three))
    big = batch([token_record("i1", 200, 1), token_record("i2", 10, 1)], 200)
    assert "= 400 tokens > contract budget 256" in str(contract_violation(c, big))
    oversized = batch([token_record("i1", 1000, 1)], 1000)
    assert contract_violation(c, oversized) is None  # a single oversized item travels alone
    other_model = received(
        outgoing_batch("b", "card-a", [token_record("i1", 8, 1, model="m2")], padded_length=8, model="m2")
    )
    assert "batch model 'm2'" in str(contract_violation(c, other_model))
    misrouted = batch([token_record("i1", 8, 1)], 8, consumer="card-b")
    assert "addressed to consumer 'card-b'" in str(contract_violation(c, misrouted))
    short = batch([token_record("i1", 100, 1)], 64)
    assert "padded_length 64 < longest item 100" in str(contract_violation(c, short))
