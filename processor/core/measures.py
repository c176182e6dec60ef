"""The figures every report computes the same way, each defined once.

Status, the Prometheus metrics, the simulator's report, the demo's measurement and a job's summary
all print a padding waste, and status, the simulator and the demo a budget fill; they call
:func:`padding_waste` and :func:`budget_fill` so each figure means one thing everywhere and a reader
can compare them. Pure arithmetic on counts, no state.
"""

from __future__ import annotations

__all__ = ["budget_fill", "padding_waste", "percentile"]


def padding_waste(real_tokens: int, padded_tokens: int) -> float | None:
    """The share of the padded tokens that were padding: ``(padded - real) / padded``.

    ``real_tokens`` are the prompt tokens of the batches, ``padded_tokens`` what computing them cost
    (items x padded length, summed over the same batches). None when nothing was padded (no batch,
    or no padded token counted): a report that prints 0 there writes ``padding_waste(...) or 0.0``.

    The difference is taken on the integers, then divided once, so the result is the exact ratio
    rounded once (``1 - real / padded`` would round twice and can differ in the last bit).
    """
    if padded_tokens <= 0:
        return None
    return (padded_tokens - real_tokens) / padded_tokens


def budget_fill(padded_tokens: int, budget_room: int) -> float | None:
    """How full the batches were against their consumers' token budgets: ``padded / room``.

    The denominator, ``budget_room``, is the sum over the batches counted of their consumer's
    ``budget_tokens`` (batches x budget for one consumer); ``padded_tokens`` is what they cost (items x
    padded length, summed over the same batches). Count only batches that are not a single oversized
    item: such an item goes alone, past the budget, and would read a fill above 1 (status counts
    them apart, as ``oversized``). None when there is no room (no such batch): a report that prints
    0 there writes ``budget_fill(...) or 0.0``.

    Only for token batching: a consumer batching by rows or by memory has no token budget to fill.
    """
    if budget_room <= 0:
        return None
    return padded_tokens / budget_room


def percentile(ordered: list[int] | list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``ordered`` (sorted, not empty) by linear interpolation between
    the two nearest ranks, numpy's default, so figures match those computed with numpy (the traces'
    README)."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
