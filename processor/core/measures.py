"""The figures every report computes the same way, each defined once.

Status, the Prometheus metrics, the simulator's report, the demo's measurement and a job's summary
all print a padding waste; they call :func:`padding_waste` so the figure means one thing everywhere
and a reader can compare them. Pure arithmetic on counts, no state.
"""

from __future__ import annotations

__all__ = ["padding_waste", "percentile"]


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


def percentile(ordered: list[int] | list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``ordered`` (sorted, not empty) by linear interpolation between
    the two nearest ranks, numpy's default, so figures match those computed with numpy (the traces'
    README)."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
