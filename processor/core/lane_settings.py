"""The knobs of lane assignment (:class:`LaneSettings`): the lane budget, the padding threshold that
decides when an item opens a lane, when a lane goes quiet, and how a batch is cut from one.

What the knobs do: core/lanes.py; the measurements behind each default: docs/lanes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

CUT_ORDERS = ("length", "arrival")


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """The knobs of lane assignment; docs/lanes.md gives the measurements behind each default."""

    lane_budget: int = 2048
    """Most lanes one (model, shape) may hold at once."""
    cut: str = "length"
    """How a batch is cut from a lane: ``length`` (longest first, see ``cut_tokens``) or ``arrival``."""
    cut_tokens: int = 64
    """``cut="length"``: an item joins a batch only if it pads by at most this many tokens to the
    batch's longest item (counted in whole ``pad_multiple``s of the contract), and by at most
    ``cut_ratio`` of that longest item's length; the batch is cut there."""
    cut_ratio: float = 0.015
    pad_multiple: int = 8
    """Rounding used to measure padding when choosing a lane (consumers use their own for batches)."""
    floor_tokens: int = 1 << 20
    """Padding at or below this many tokens never opens a lane. The default keeps one lane per shape,
    cut by length (docs/lanes.md measures it against the narrow lanes of ``floor_tokens=0,
    cap_tokens=256``). Padding is counted in whole pad multiples, so any floor below
    ``pad_multiple`` means "same padded length always shares a lane"."""
    cap_tokens: int = 1 << 20
    """Padding above this is never accepted while a lane can be opened or reclaimed."""
    start_ratio: float = 0.002
    """Threshold, as a fraction of the item's length, when the shape has no lanes."""
    full_ratio: float = 0.05
    """Threshold, as a fraction of the item's length, when the shape's lane budget is full."""
    idle_ms: int = 3000
    """An empty lane goes quiet (its id is reused) after this long without items."""

    def __post_init__(self) -> None:
        if self.lane_budget < 1:
            raise ValueError(f"lane_budget must be >= 1, got {self.lane_budget}")
        if self.pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {self.pad_multiple}")
        if not 0 <= self.floor_tokens <= self.cap_tokens:
            raise ValueError(
                f"need 0 <= floor_tokens <= cap_tokens, got floor {self.floor_tokens}, cap {self.cap_tokens}"
            )
        if not 0 <= self.start_ratio <= self.full_ratio:
            raise ValueError(
                f"need 0 <= start_ratio <= full_ratio, got {self.start_ratio} and {self.full_ratio}"
            )
        if self.idle_ms < 0:
            raise ValueError(f"idle_ms must be >= 0, got {self.idle_ms}")
        if self.cut not in CUT_ORDERS:
            raise ValueError(f"cut must be one of {', '.join(CUT_ORDERS)}, got {self.cut!r}")
        if self.cut_tokens < 0:
            raise ValueError(f"cut_tokens must be >= 0, got {self.cut_tokens}")
        if self.cut_ratio < 0:
            raise ValueError(f"cut_ratio must be >= 0, got {self.cut_ratio}")

    def threshold_tokens(self, length: int, lanes_in_use: int) -> float:
        """Padding above which an item of ``length`` tokens opens a lane, given the budget's fill."""
        fill = lanes_in_use / self.lane_budget
        ratio = self.start_ratio + (self.full_ratio - self.start_ratio) * fill
        return max(self.floor_tokens, min(self.cap_tokens, length * ratio))
