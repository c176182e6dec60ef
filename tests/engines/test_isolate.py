"""Splitting a refused request until its bad prompts are alone (processor/engines/isolate.py), against a
scripted sender: which requests go out, which items fail, and what is never split."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from processor.engines.isolate import Refusal, belongs_to_a_prompt, isolate


class Sender:
    """Refuses (400) any request holding a bad item; records every request; ``down`` fails all."""

    def __init__(self, bad: set[int], down: bool = False) -> None:
        self.bad = bad
        self.down = down
        self.sent: list[list[int]] = []

    def __call__(self, items: Sequence[int]) -> list[str] | Refusal:
        self.sent.append(list(items))
        if self.down:
            return [f"failed {i}: connection refused" for i in items]
        if self.bad & set(items):
            return Refusal(400, "HTTP 400: Prompt contains invalid tokens")
        return [f"ok {i}" for i in items]


def refused(item: int, refusal: Refusal, sent: int) -> str:
    return f"refused {item} ({refusal.status}, {sent} sent): {refusal.reason}"


def test_a_request_the_server_takes_is_sent_once() -> None:
    sender = Sender(bad=set())
    assert isolate(list(range(5)), sender, refused) == [f"ok {i}" for i in range(5)]
    assert sender.sent == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("n", [2, 3, 8, 13])
def test_one_bad_row_fails_alone_and_the_others_complete(n: int) -> None:
    bad = n // 2
    sender = Sender(bad={bad})
    results = isolate(list(range(n)), sender, refused)

    assert results == [
        f"refused {i} (400, {n} sent): HTTP 400: Prompt contains invalid tokens" if i == bad else f"ok {i}"
        for i in range(n)
    ]
    assert len(sender.sent) <= 2 * math.ceil(math.log2(n)) + 1
    assert [bad] in sender.sent  # it failed alone, not as part of a bigger request


def test_several_bad_rows_each_fail_alone() -> None:
    sender = Sender(bad={0, 5, 6})
    results = isolate(list(range(8)), sender, refused)
    assert [r.split()[0] for r in results] == ["refused", "ok", "ok", "ok", "ok", "refused", "refused", "ok"]


def test_every_row_bad_isolates_every_row() -> None:
    sender = Sender(bad={0, 1, 2, 3})
    results = isolate([0, 1, 2, 3], sender, refused)
    assert all(r.startswith("refused") for r in results)
    assert sorted(part for part in sender.sent if len(part) == 1) == [[0], [1], [2], [3]]


def test_a_failure_that_is_no_refusal_is_not_split() -> None:
    """A server that is down answers each item itself through ``send``: one request, no halves."""
    sender = Sender(bad={2}, down=True)
    results = isolate(list(range(6)), sender, refused)
    assert sender.sent == [[0, 1, 2, 3, 4, 5]]
    assert results == [f"failed {i}: connection refused" for i in range(6)]


@pytest.mark.parametrize("status", [400, 413, 422])
def test_statuses_that_refuse_a_body_may_be_one_prompts_fault(status: int) -> None:
    assert belongs_to_a_prompt(status)


@pytest.mark.parametrize("status", [401, 403, 404, 408, 429, 500, 502, 503, 301])
def test_statuses_about_credentials_routes_load_or_outages_are_never_split(status: int) -> None:
    assert not belongs_to_a_prompt(status)
