"""Padding waste (processor/core/measures.py): the one definition every report calls."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from processor.core.measures import padding_waste


def test_waste_is_the_padding_over_the_padded_tokens() -> None:
    assert padding_waste(14, 16) == 0.125
    assert padding_waste(16, 16) == 0.0
    assert padding_waste(0, 8) == 1.0


def test_nothing_padded_has_no_waste_to_report() -> None:
    assert padding_waste(0, 0) is None
    assert (padding_waste(0, 0) or 0.0) == 0.0  # what a report that prints 0 writes


@given(st.integers(1, 1 << 40).flatmap(lambda p: st.tuples(st.integers(0, p), st.just(p))))
def test_the_figure_is_the_exact_ratio_rounded_once(counts: tuple[int, int]) -> None:
    """``1 - real / padded`` rounds twice (0.0010000000000000009 for 999 of 1,000): every report must
    print the same figure for the same counts, so the one definition is the correctly rounded one."""
    real, padded = counts
    assert padding_waste(real, padded) == float(Fraction(padded - real, padded))


def test_the_double_rounding_it_avoids() -> None:
    assert padding_waste(999, 1000) == 0.001 != 1 - 999 / 1000
