"""What the scheduler's parts share, passed to each of them as one object.

The scheduler (core/scheduler.py) is one object to its callers and several inside: the hot path
(submit, dispatch, complete) is its own, taking back and letting go of work in a partition handover
is :class:`~processor.core.adoption.Adoption`'s, withdrawing the items of jobs that end is
:class:`~processor.core.endings.Withdrawals`', and the read-only figures are
:class:`~processor.core.view.SchedulerView`'s. None of them reaches into another's attributes: each
is handed this context, the one owner of every reference they share.

Invariant: a part that replaces a shared object (a handover's fresh lane table, a ledger resumed
from a checkpoint) rebinds it here, so every part reads the new one at its next step; nothing keeps
``table`` or ``ledger`` in an attribute of its own. The other members are cleared in place, never
replaced, which is what lets :class:`~processor.core.dispatch.DispatchRules` hold them directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from processor.core.accounting import Ledger
from processor.core.endings import JobEndings
from processor.core.inflight import ConsumerState, InFlightTable
from processor.core.item import Item
from processor.core.lanes import LaneTable, ShapeKey, ShapeLanes
from processor.core.shares import Shares
from processor.core.switch_order import SwitchOrder


@dataclass(slots=True, eq=False, repr=False)
class SchedulerContext:
    """The scheduler's state: owned by its thread, shared by its parts by reference."""

    table: LaneTable
    """Every waiting item, in its shape's lanes (replaced, with its counters carried on, by a handover)."""
    ledger: Ledger
    """The counts at each stage; the scheduler's parts are its only writers (replaced by a resume)."""
    shares: Shares
    """Token shares between jobs: their policies, quotas and virtual times."""
    consumers: dict[str, ConsumerState] = field(default_factory=dict)
    """Every consumer with a contract, by name, in the order they announced."""
    by_model: dict[str, list[ConsumerState]] = field(default_factory=dict)
    """The same consumers per model they serve."""
    active: dict[str, dict[ShapeKey, ShapeLanes]] = field(default_factory=dict)
    """Per model, the shapes that hold waiting items."""
    arrivals: dict[str, deque[Item]] = field(default_factory=dict)
    """Per model, the items in arrival order (dispatched ones leave lazily from the front)."""
    order: SwitchOrder = field(default_factory=SwitchOrder)
    """Rule 3's order of the active shapes, kept as they change (core/switch_order.py)."""
    flights: InFlightTable = field(default_factory=InFlightTable)
    """The batches in flight, by id."""
    endings: JobEndings = field(default_factory=JobEndings)
    """Which jobs ended and how, the deadlines of the rest, the items withdrawn since last taken."""
    oversized: int = 0
    """Single-item batches sent although they exceed their consumer's batching rule."""
    counted_before: Ledger = field(default_factory=Ledger)
    """The counts the ledger resumed from (a checkpoint of an earlier process), kept as they were:
    what this process counted itself is the ledger less these (the metrics' counters export that)."""
