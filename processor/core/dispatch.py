"""The dispatch rules: which lane a consumer's next batch comes from (shape-sticky dispatch).

The rules, in the order they are applied when a consumer has a free in-flight slot:

1. **Deadline.** If the oldest waiting item of the consumer's model has waited ``max_wait_ms`` and the
   consumer may take its lane, the batch comes from that lane, cut around that item. If the item is in
   another shape, the consumer moves there only once it has stayed ``max_wait_ms`` on its current
   shape. Under the default ``deadline="overtaking"`` the item must also be *overtaken*: the shape the
   consumer would otherwise serve (rules 2 and 3) has received an item ``max_wait_ms`` or more after
   it, and no other consumer that may take the item's lane is on the item's shape (that consumer's
   own rule 1 serves it, in its shape, at its next free slot). In a backlog, where everything arrived
   together, nothing is overtaken and the deadline costs no switch; in streaming a cold item behind a
   hot shape is overtaken by the hot shape's fresh items, as under ``deadline="absolute"`` (the first
   generation's rule, which does not ask). An item therefore waits at most about
   ``max_wait_ms x (1 + shapes holding older overdue items)`` plus one batch's engine time, plus the
   engine time of what arrived within ``max_wait_ms`` after it: it is never passed by a batch of items
   more than ``max_wait_ms`` younger once it is overdue (tests/core/test_properties.py,
   tests/core/test_scheduler.py).
2. **Stick.** Otherwise the batch comes from the consumer's current shape while that shape has a lane
   it may take, lanes served round-robin (a lane that still holds items after a batch goes to the back).
3. **Switch.** Otherwise the consumer moves to the shape of its model with the most waiting tokens
   that has a lane it may take, preferring (``spread``) shapes no other consumer of the model is on;
   ties go to the shape that became active first. The shapes are kept in that order as their waiting
   tokens change (core/switch_order.py), so a switch costs O(log shapes), not a scan.

**Shares.** When several jobs of the consumer's model wait, or a job has a quota, the three rules
ask ``core/shares.py`` (one :class:`~processor.core.shares.Gate` per decision,
:meth:`DispatchRules.choose`): the deadline serves only a job within its share, the consumer sticks
only while its job is not too far ahead of the most owed one, and a switch goes to the most owed
job's shape (the consumer's own job first while it may keep it). A quota caps the items a batch
takes. With one job and no quota the rules are exactly the three above.

How a batch is cut from its lane (arrival order, or by length from the lane's sweep down) is the
lane table's ``take_batch`` (processor/core/lanes.py, processor/core/cut.py).

A consumer *may take* a lane whose longest item (the longest waiting one when lanes are cut by length,
else the lane's representative length), alone, fits its batching rule (with the
head item's output budget in memory mode), or one that fits no live consumer of the model (its items
then go out as single oversized batches). A small card is thus never sent an item a bigger card of the
same model could hold.

The scheduler (core/scheduler.py) owns the state these rules read and cuts the batch they choose.
Every batch is checked as it is emitted: one model, one shape, one lane, within the consumer's
batching rule (``contract.BatchRule.fits``) unless it is a single oversized item. A violation raises
``InvariantViolation`` and the scheduler must not be used again: stopping is better than sending a GPU
a mixed batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from processor.core.contract import Contract
from processor.core.inflight import ConsumerState
from processor.core.item import Item
from processor.core.lane import ByLength, Lane
from processor.core.lanes import ShapeKey, ShapeLanes, key_job, shape_key
from processor.core.shares import Gate, Shares
from processor.core.switch_order import INELIGIBLE, Ineligible, SwitchOrder

DEADLINES = ("overtaking", "absolute")


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """The knobs of the dispatch rules (the module docstring states the rules they tune)."""

    max_wait_ms: int = 60_000
    """An item waiting this long takes priority over shape stickiness (see rule 1)."""
    deadline: str = "overtaking"
    """``overtaking``: an overdue item takes priority only over batches holding items that arrived
    ``max_wait_ms`` after it, and not while a peer serving its shape can take it (rule 1);
    ``absolute``: over every batch (the first generation's rule)."""
    spread: bool = True
    """Rule 3 prefers a shape no other consumer of the model is on (``False``: most waiting tokens)."""

    def __post_init__(self) -> None:
        if self.max_wait_ms < 1:
            raise ValueError(f"max_wait_ms must be >= 1, got {self.max_wait_ms}")
        if self.deadline not in DEADLINES:
            raise ValueError(f"deadline must be one of {', '.join(DEADLINES)}, got {self.deadline!r}")


Choice = tuple[ShapeLanes, Lane, Item | None, int | None]
"""Where a batch comes from: the shape's lanes, the lane, the item to cut it around (an overdue one)
or None, and the most items it may hold (a job's quota) or None."""


def _fits(contract: Contract, lane: Lane, by_length: bool) -> bool:
    """Whether ``contract`` holds the lane's longest item alone (its longest waiting one when the lane
    is cut by length, else its representative length: the longest the lane ever held, since in
    arrival order any waiting item may be the longest), counting the head item's output budget: the
    head is what would otherwise go out oversized."""
    rule = contract.rule
    items = lane.items
    longest = items.lengths[-1] if by_length and type(items) is ByLength else lane.rep
    if rule.longest_alone >= 0:  # outputs uncounted: fitting alone is a comparison of lengths
        return longest <= rule.longest_alone
    return rule.fits_alone(longest, lane.head().output_budget if lane.tokens else 0)


def _threshold(contract: Contract) -> int | None:
    """What rule 3's order parks refused shapes under for ``contract`` (core/switch_order.py): the
    longest item it holds alone, in rows and tokens mode; None in memory mode, where whether an item
    fits alone depends on its output budget too (nothing is parked)."""
    alone = contract.rule.longest_alone
    return alone if alone >= 0 else None


def _fits_item(contract: Contract, item: Item) -> bool:
    return contract.rule.fits_alone(item.length, item.output_budget)


class DispatchRules:
    """The three rules over the scheduler's state, which it shares by reference: per model the shapes
    that hold waiting items (``active``), the consumers (``by_model``) and the items in arrival order
    (``arrivals``, dispatched ones dropped lazily from the front). It changes none of them but that
    lazy drop: the scheduler cuts the batch a rule chooses, and updates them. Rule 3 reads the active
    shapes in its order from ``order`` (core/switch_order.py), which the scheduler keeps as waiting
    tokens change."""

    __slots__ = ("_active", "_arrivals", "_by_model", "_order", "by_length", "settings", "shares")

    def __init__(
        self,
        settings: DispatchSettings,
        shares: Shares,
        by_length: bool,
        active: dict[str, dict[ShapeKey, ShapeLanes]],
        by_model: dict[str, list[ConsumerState]],
        arrivals: dict[str, deque[Item]],
        order: SwitchOrder,
    ) -> None:
        self.settings = settings
        self.shares = shares
        self.by_length = by_length  # lanes are cut longest first (LaneSettings.cut == "length")
        self._active = active
        self._by_model = by_model
        self._arrivals = arrivals
        self._order = order

    def choose(self, state: ConsumerState, now_ms: int) -> Choice | None:
        """Where ``state``'s consumer's next batch comes from, by rules 1 to 3 and the shares; None
        when it may take nothing now."""
        model = state.contract.model
        active = self._active.get(model)
        if not active:
            return None
        peers = self._by_model[model]
        shares = self.shares  # Shares.gate's own test first, without a call: None is the common case
        gate = shares.gate(model, now_ms) if shares.quota_count or model in shares.contended else None
        choice: tuple[ShapeLanes, Lane] | None = None
        if state.shape is not None:
            sl = active.get(state.shape)
            if sl is not None and (gate is None or gate.keeps(sl.job, _ahead(state, peers, active, gate))):
                lane = self._eligible_lane(sl, state.contract, peers)
                if lane is not None and (gate is None or gate.allows(sl, lane)):
                    choice = (sl, lane)
        if choice is None:
            if gate is None:
                choice = self._switch_target(state, peers)
            else:
                choice = self._shared_target(state, active, peers, gate)
        overdue = self._overdue(state, peers, now_ms, choice)
        if overdue is not None and (
            gate is None or (gate.admits(overdue[0].job) and gate.allows(overdue[0], overdue[1]))
        ):
            sl, lane, anchor = overdue
            return sl, lane, anchor, None if gate is None else gate.room(sl, lane)
        if choice is None:
            return None
        sl, lane = choice
        return sl, lane, None, None if gate is None else gate.room(sl, lane)

    def _overdue(
        self,
        state: ConsumerState,
        peers: list[ConsumerState],
        now_ms: int,
        choice: tuple[ShapeLanes, Lane] | None,
    ) -> tuple[ShapeLanes, Lane, Item | None] | None:
        """Rule 1, the deadline: the lane of the model's oldest waiting item, and that item (the
        anchor its batch is cut around, under the overtaking deadline), when it overrides ``choice``
        (the batch rules 2 and 3 would give); None when it does not.

        The item must have waited ``max_wait_ms``. A consumer on another shape leaves it for the item
        only after staying there ``max_wait_ms``. Under ``deadline="overtaking"`` the item must also be
        overtaken: ``choice``'s shape has received an item ``max_wait_ms`` or more after it (in a
        backlog, where everything arrived together, nothing is ever overtaken), and no other consumer
        that may take the item's lane is on its shape (that one serves it: it is overtaken by nothing
        there but what arrived within ``max_wait_ms`` after it).
        """
        arrivals = self._arrivals[state.contract.model]
        while arrivals and arrivals[0].dispatched:
            arrivals.popleft()
        if not arrivals:
            return None
        oldest = arrivals[0]
        max_wait = self.settings.max_wait_ms
        if now_ms - oldest.arrival_ms < max_wait:
            return None
        key = shape_key(oldest.model, oldest.shape, oldest.job)
        if key != state.shape and state.shape is not None and now_ms - state.switched_ms < max_wait:
            return None
        sl = self._active[oldest.model][key]
        lane = sl.lanes[oldest.lane]
        if not self._may_take(lane, state.contract, peers):
            return None
        if (
            self.by_length
            and not _fits_item(state.contract, oldest)
            and any(_fits_item(p.contract, oldest) for p in peers)
        ):
            return None  # a bigger peer holds it
        if self.settings.deadline == "absolute":
            return sl, lane, None
        if choice is not None and choice[0].newest_ms - oldest.arrival_ms < max_wait:
            return None  # what this consumer would serve arrived within max_wait_ms of the item
        for peer in peers:
            if peer is not state and peer.shape == key and _fits(peer.contract, lane, self.by_length):
                return None
        return sl, lane, oldest

    def _may_take(self, lane: Lane, contract: Contract, peers: list[ConsumerState]) -> bool:
        """A lane whose longest item ``contract`` holds alone, or that no peer holds (its head then goes
        out oversized); cut by length, also one whose shortest item it holds while a peer holds the
        longest (:meth:`_leaves_longer`: the batch starts below what the peer must take)."""
        by_length = self.by_length
        if _fits(contract, lane, by_length):
            return True
        if not any(_fits(p.contract, lane, by_length) for p in peers):
            return True
        return by_length and _fits_item(contract, lane.shortest())

    def leaves_longer(self, contract: Contract, lane: Lane) -> bool:
        """Whether a batch for ``contract`` must leave the lane's longest items to a peer that holds
        them (cut by length, the lane may hold items only the bigger cards of the model take)."""
        if not self.by_length or _fits(contract, lane, True):
            return False
        return any(_fits(p.contract, lane, True) for p in self._by_model[contract.model])

    def _eligible_lane(self, sl: ShapeLanes, contract: Contract, peers: list[ConsumerState]) -> Lane | None:
        if len(peers) == 1:
            return next(iter(sl.ready.values()), None)
        by_length = self.by_length
        for lane in sl.ready.values():  # _may_take's first test first: the common answer, no call
            if _fits(contract, lane, by_length) or self._may_take(lane, contract, peers):
                return lane
        return None

    def _switch_target(
        self, state: ConsumerState, peers: list[ConsumerState]
    ) -> tuple[ShapeLanes, Lane] | None:
        """Rule 3 with one job waiting (no gate: ``Shares.gate`` is None only then): the first shape
        in rule 3's order with a lane the consumer may take."""
        contract = state.contract
        model = contract.model
        (job,) = self._order.jobs(model)

        def eligible(sl: ShapeLanes) -> tuple[ShapeLanes, Lane] | Ineligible:
            lane = self._eligible_lane(sl, contract, peers)
            return INELIGIBLE if lane is None else (sl, lane)

        return self._order.first(model, job, self._taken(state, peers), eligible, _threshold(contract))

    def _shared_target(
        self, state: ConsumerState, active: dict[ShapeKey, ShapeLanes], peers: list[ConsumerState], gate: Gate
    ) -> tuple[ShapeLanes, Lane] | None:
        """The switch rule under shares: the most owed job's shapes first (the consumer's own job
        first while it may keep it), within a job the one with the most waiting tokens; a lane the
        job's quota leaves no room in is passed over."""
        contract = state.contract
        model = contract.model
        by_job = self._order.jobs(model)  # in the order the scan of ``active`` meets them
        jobs = gate.order(by_job)
        own = key_job(state.shape) if state.shape is not None else None
        if own in by_job and own in jobs and gate.keeps(own, _ahead(state, peers, active, gate)):
            jobs.remove(own)
            jobs.insert(0, own)

        def allowed(sl: ShapeLanes) -> tuple[ShapeLanes, Lane] | Ineligible | None:
            lane = self._eligible_lane(sl, contract, peers)
            if lane is None:
                return INELIGIBLE
            return (sl, lane) if gate.allows(sl, lane) else None  # a quota's refusal is not parked

        taken = self._taken(state, peers)
        threshold = _threshold(contract)
        for job in jobs:
            found = self._order.first(model, job, taken, allowed, threshold)
            if found is not None:
                return found
        return None

    def _taken(self, state: ConsumerState, peers: list[ConsumerState]) -> set[ShapeKey]:
        """The shapes rule 3 puts last: with ``spread``, those another consumer of the model is on (two
        cards on one shape both pay its prefix-cache miss and both switch again when it drains; on
        different shapes each pays once). Within each part, most waiting tokens first
        (core/switch_order.py)."""
        if not self.settings.spread or len(peers) < 2:
            return set()
        return {p.shape for p in peers if p is not state and p.shape is not None}


def _ahead(
    state: ConsumerState, peers: list[ConsumerState], active: dict[ShapeKey, ShapeLanes], gate: Gate
) -> int:
    """How many of the model's other consumers are on (still waiting) shapes of jobs more owed than
    ``state``'s own job: each lets ``state`` keep its job a ``slack_tokens`` longer (core/shares.py)."""
    if state.shape is None:
        return 0
    mine = gate.vtime(key_job(state.shape))
    return sum(
        1
        for p in peers
        if p is not state
        and p.shape is not None
        and p.shape in active
        and gate.vtime(key_job(p.shape)) < mine
    )
