"""``demo --repeat N``: the runs' order per repeat, and the medians and ranges over the repeats.

Why a module of its own: the demo runs each pipeline N times, alternating the order (tokenfabric
first in even repeats, last in odd ones) so a machine whose load drifts does not favour one run; the
report then stands on the repeat of each run whose makespan is the median, and the JSON carries
every repeat. Invariants: :func:`median_repeat` returns one of the repeats given (never a blend), so
every figure printed for a run comes from one measured repeat; ``makespan_s`` in the JSON is the
median of the repeats' makespans (the mean of the two middle ones for an even count).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from processor.local.compare import RunFigures

#: The keys every run and every repeat carries in ``--json`` (docs/demo.md), besides the full figures.
HEADLINE_KEYS = (
    "engine",
    "items",
    "items_completed_once",
    "audit_clean",
    "duplicates",
    "prompt_tokens",
    "prefix_tokens",
    "cached_prompt_tokens",
    "output_tokens",
    "makespan_s",
)


def run_order(runs: Sequence[str], repeat: int) -> list[str]:
    """The runs of repeat ``repeat`` (from 0): as given in even repeats, reversed in odd ones."""
    return list(runs) if repeat % 2 == 0 else list(reversed(runs))


def median_repeat(repeats: Sequence[RunFigures]) -> RunFigures:
    """The repeat whose makespan is the median (the lower middle one for an even count)."""
    ranked = sorted(repeats, key=lambda f: f.makespan_s)
    return ranked[(len(ranked) - 1) // 2]


def repeat_dict(f: RunFigures, audits: bool) -> dict[str, Any]:
    """One repeat's figures, with ``duplicates`` and ``audit_clean`` None for a run that cannot audit."""
    out = f.to_dict()
    out["duplicates"] = f.duplicate_completions
    if not audits:
        out["audit_clean"] = None
    return out


def run_dict(repeats: Sequence[RunFigures], audits: bool) -> dict[str, Any]:
    """A run's JSON: its median repeat's figures, ``makespan_s`` the median, ``repeats`` every one."""
    out = repeat_dict(median_repeat(repeats), audits)
    out["makespan_s"] = round(statistics.median(f.makespan_s for f in repeats), 3)
    out["makespan_s_range"] = [round(min(f.makespan_s for f in repeats), 3),
                               round(max(f.makespan_s for f in repeats), 3)]  # fmt: skip
    out["repeats"] = [repeat_dict(f, audits) for f in repeats]
    return out


def headline(runs: Mapping[str, Sequence[RunFigures]]) -> str:
    """Lines of at most 80 columns: each run's median makespan and range, then the better baseline's
    median over tokenfabric's."""
    medians = {name: statistics.median(f.makespan_s for f in reps) for name, reps in runs.items()}
    lines = [f"makespan, median of {len(next(iter(runs.values())))} repeat(s) (range):"]
    for name, reps in runs.items():
        low, high = min(f.makespan_s for f in reps), max(f.makespan_s for f in reps)
        lines.append(f"  {name:<12} {medians[name]:8.1f} s ({low:.1f} to {high:.1f})")
    baselines = {n: m for n, m in medians.items() if n != "tokenfabric"}
    if "tokenfabric" in medians and baselines and medians["tokenfabric"] > 0:
        better = min(baselines, key=lambda n: baselines[n])
        ratio = baselines[better] / medians["tokenfabric"]
        lines.append(f"better baseline ({better}) / tokenfabric: {ratio:.2f}x")
    return "\n".join(lines)
