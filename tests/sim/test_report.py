"""The report's figures: the exact rank selection behind the wait percentiles."""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.sim import report
from processor.sim.report import SimReport, kth_smallest


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(-50, 50) | st.integers(0, 10**9), min_size=1, max_size=400),
    at=st.floats(0.0, 1.0),
    sample=st.sampled_from([2, 3, 8, 2048]),
)
def test_kth_smallest_is_the_sorted_lists_whatever_the_sample(
    values: list[int], at: float, sample: int
) -> None:
    """A small ``_SAMPLE`` sends short lists through the bracket (and its fallback when the bracket
    misses); the answer is always ``sorted(values)[k]``."""
    k = min(len(values) - 1, int(at * len(values)))
    with mock.patch.object(report, "_SAMPLE", sample), mock.patch.object(report, "_MARGIN", 1):
        assert kth_smallest(values, k) == sorted(values)[k]


@pytest.mark.parametrize(
    "values",
    [
        [random.Random(1).randrange(5_000_000) for _ in range(100_000)],  # the bracket holds the rank
        [0 if i % 48 == 0 else i for i in range(100_000)],  # the strided sample is all 0: brackets miss
        list(range(100_000, 0, -1)),  # descending
    ],
    ids=["random", "periodic", "descending"],
)
@pytest.mark.parametrize("q", [0.0, 0.001, 0.5, 0.99, 1.0])
def test_kth_smallest_is_exact_on_long_lists(values: list[int], q: float) -> None:
    k = min(len(values) - 1, int(q * len(values)))
    assert kth_smallest(values, k) == sorted(values)[k]


def test_kth_smallest_refuses_a_rank_out_of_range() -> None:
    with pytest.raises(IndexError, match="rank 3 of 3"):
        kth_smallest([1, 2, 3], 3)


def test_wait_percentiles_are_nearest_ranks_and_leave_the_waits_as_they_were() -> None:
    waits = [random.Random(2).randrange(10_000) for _ in range(30_001)]
    r = SimReport("lanes", None, waits_ms=list(waits))
    ordered = sorted(waits)
    assert r.wait_percentile(0.5) == ordered[15_000]
    assert r.wait_percentile(0.99) == ordered[29_700]
    assert r.wait_percentile(1.0) == ordered[-1]
    assert r.waits_ms == waits
    assert SimReport("lanes", None).wait_percentile(0.5) == 0
