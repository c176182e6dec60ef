"""What a GPU consumer promises to accept: a model, how it batches, and the numbers that bound a batch.

A batch pads every item to its longest item rounded up to ``pad_multiple``. What bounds it depends on
the consumer's ``batching`` mode (docs/consumer-contract.md, "Batching modes"):

- ``rows``: ``max_items`` only, for engines whose cost is per request;
- ``tokens`` (the default): ``items x padded_length <= budget_tokens`` and ``max_items``, for
  compute-bound prefill;
- ``memory``: ``(items x padded_length + summed output tokens) x kv_bytes_per_token <= memory_bytes``
  and ``max_items``, for generation, where the KV cache of prompt plus output bounds the batch.

:class:`BatchRule` states that rule once; the lanes, dispatch, the baselines and the consumer app's own
check all ask it, so they cannot disagree. ``max_inflight`` is how many batches the consumer holds at
once: the processor never sends more, so a slow card is never buried under work it cannot start.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from processor.core.item import Batch

CONSUMER_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")

BatchingMode = Literal["rows", "tokens", "memory"]
BATCHING_MODES: tuple[BatchingMode, ...] = ("rows", "tokens", "memory")


def round_up(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    if length <= multiple:
        return multiple
    return -(-length // multiple) * multiple


@dataclass(frozen=True, slots=True)
class BatchRule:
    """Whether a batch fits, in one place: ``fits(n, longest, output_tokens)``.

    A batch of ``n`` items whose longest item has ``longest`` tokens and whose items' output budgets
    sum to ``output_tokens`` has a *load* in the mode's unit (items, padded tokens or KV bytes); it
    fits when ``n <= max_items`` and the load is at most the mode's *limit*. The rule is monotone: a
    batch that fits still fits with an item fewer, which is what lets packing stop at the first item
    that does not fit. A single item that does not fit is *oversized*; it travels alone (rows mode
    has no such item: ``max_items >= 1``).
    """

    max_items: int
    pad_multiple: int = 8
    batching: BatchingMode = "tokens"
    budget_tokens: int = 0
    """Padded-token budget; bounds batches in tokens mode only."""
    memory_bytes: int = 0
    """KV-cache bytes one batch may fill; bounds batches in memory mode only."""
    kv_bytes_per_token: int = 0
    """KV-cache bytes per token of the model (all layers, keys and values)."""
    default_output_tokens: int = 0
    """Output tokens counted for an item that carries no output budget (memory mode)."""
    limit: int = field(init=False, repr=False, compare=False)
    """The bound a batch's load is compared with, in the mode's unit: ``max_items`` (rows),
    ``budget_tokens`` (tokens) or ``memory_bytes`` (memory). Kept as a field: packing asks per item."""
    counts_output: bool = field(init=False, repr=False, compare=False)
    """Whether output budgets enter the load (memory mode); packing skips summing them otherwise."""
    longest_alone: int = field(init=False, repr=False, compare=False)
    """In rows and tokens mode, where outputs do not count, the longest item that fits alone (dispatch
    asks of every lane it looks at); -1 in memory mode, where it depends on the item's outputs."""

    def __post_init__(self) -> None:
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {', '.join(BATCHING_MODES)}, got {self.batching!r}")
        for name in ("max_items", "pad_multiple"):
            _check_int(name, getattr(self, name), 1)
        for name in ("budget_tokens", "memory_bytes", "kv_bytes_per_token", "default_output_tokens"):
            _check_int(name, getattr(self, name), 0)
        needed = {"tokens": ("budget_tokens",), "memory": ("memory_bytes", "kv_bytes_per_token")}
        for name in needed.get(self.batching, ()):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name} must be >= 1 in {self.batching} batching, got {getattr(self, name)}"
                )
        limits = {"rows": self.max_items, "tokens": self.budget_tokens, "memory": self.memory_bytes}
        object.__setattr__(self, "limit", limits[self.batching])
        alone = {"rows": 1 << 62, "tokens": self.budget_tokens // self.pad_multiple * self.pad_multiple}
        object.__setattr__(self, "longest_alone", alone.get(self.batching, -1))
        object.__setattr__(self, "counts_output", self.batching == "memory")

    def padded_length(self, length: int) -> int:
        return round_up(length, self.pad_multiple)

    def output_tokens(self, output_budget: int | None) -> int:
        """Output tokens an item counts for: its own budget, else the default (a negative one is 0)."""
        if output_budget is None:
            return self.default_output_tokens
        return output_budget if output_budget > 0 else 0

    @property
    def load_unit(self) -> str:
        return {"rows": "items", "tokens": "padded tokens", "memory": "KV bytes"}[self.batching]

    @property
    def limit_name(self) -> str:
        return {"rows": "max_items", "tokens": "budget", "memory": "memory_bytes"}[self.batching]

    def load(self, n_items: int, longest: int, output_tokens: int = 0) -> int:
        """What a batch costs in the mode's unit: items, padded tokens, or KV bytes."""
        mode = self.batching
        if mode == "rows":
            return n_items
        pm = self.pad_multiple
        padded = -(-longest // pm) * pm or pm  # round_up, inlined: packing asks once per item
        if mode == "tokens":
            return n_items * padded
        return (n_items * padded + output_tokens) * self.kv_bytes_per_token

    def fits(self, n_items: int, longest: int, output_tokens: int = 0) -> bool:
        """True if ``n_items`` items, the longest ``longest`` tokens, outputs summing to
        ``output_tokens``, make a batch within the contract. The batching rule; nothing restates it."""
        return n_items <= self.max_items and self.load(n_items, longest, output_tokens) <= self.limit

    def fits_alone(self, length: int, output_budget: int | None = None) -> bool:
        """``fits(1, length, output_tokens(output_budget))``: whether one item of ``length`` tokens
        and that output budget fits (in rows and tokens mode a comparison with ``longest_alone``)."""
        if self.longest_alone >= 0:
            return length <= self.longest_alone
        return self.fits(1, length, self.output_tokens(output_budget))

    def capacity(self, longest: int, output_tokens_each: int = 0) -> int:
        """Most items of ``longest`` tokens and ``output_tokens_each`` output tokens that fit one
        batch; 0 when even one is oversized. In rows and tokens mode (outputs do not count) it is
        the closed form of :meth:`fits`; in memory mode it is found by bisection over :meth:`fits`
        (it is monotone). tests/core/test_batching_modes.py checks both against the rule restated."""
        if self.batching == "rows":
            return self.max_items
        if self.batching == "tokens":
            pm = self.pad_multiple
            return min(self.max_items, self.budget_tokens // (-(-longest // pm) * pm or pm))
        return self._bisect_capacity(longest, output_tokens_each)

    def _bisect_capacity(self, longest: int, output_tokens_each: int) -> int:
        low, high = 0, self.max_items
        while low < high:
            mid = (low + high + 1) // 2
            if self.fits(mid, longest, mid * output_tokens_each):
                low = mid
            else:
                high = mid - 1
        return low

    def describe(self, n_items: int, longest: int, output_tokens: int = 0) -> str:
        """The load with its arithmetic, for error messages."""
        padded = round_up(longest, self.pad_multiple)
        load = self.load(n_items, longest, output_tokens)
        if self.batching == "tokens":
            return f"{n_items} items x padded_length {padded} = {load} tokens"
        if self.batching == "memory":
            return (
                f"({n_items} items x padded_length {padded} + {output_tokens} output tokens) x "
                f"{self.kv_bytes_per_token} bytes per token = {load} bytes"
            )
        return f"{n_items} items"


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        kind = "a positive integer" if low == 1 else "an integer >= 0"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Contract:
    """A consumer's announcement. The batching fields default to today's tokens mode, so a contract
    built (or decoded) without them means exactly what it did before they existed."""

    consumer: str
    model: str
    budget_tokens: int
    max_items: int
    pad_multiple: int = 8
    max_inflight: int = 2
    batching: BatchingMode = "tokens"
    memory_bytes: int = 0
    kv_bytes_per_token: int = 0
    default_output_tokens: int = 0
    rule: BatchRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not CONSUMER_ID.match(self.consumer):
            raise ValueError(
                f"contract: consumer id {self.consumer!r} must be 1-200 of A-Z a-z 0-9 . _ - "
                "(it names the consumer's batch topic)"
            )
        if not self.model:
            raise ValueError(f"contract {self.consumer}: model must not be empty")
        try:
            for name in ("budget_tokens", "max_inflight"):
                _check_int(name, getattr(self, name), 1)
            rule = BatchRule(
                max_items=self.max_items,
                pad_multiple=self.pad_multiple,
                batching=self.batching,
                budget_tokens=self.budget_tokens,
                memory_bytes=self.memory_bytes,
                kv_bytes_per_token=self.kv_bytes_per_token,
                default_output_tokens=self.default_output_tokens,
            )
        except ValueError as exc:
            raise ValueError(f"contract {self.consumer}: {exc}") from None
        object.__setattr__(self, "rule", rule)

    def padded_length(self, length: int) -> int:
        return round_up(length, self.pad_multiple)

    def batch_cost(self, n_items: int, longest: int) -> int:
        """Padded tokens of a batch of ``n_items`` whose longest item has ``longest`` tokens."""
        return n_items * self.padded_length(longest)

    def fits(self, n_items: int, longest: int, output_tokens: int = 0) -> bool:
        """See :meth:`BatchRule.fits`."""
        return self.rule.fits(n_items, longest, output_tokens)

    def is_oversized(self, length: int, output_budget: int | None = None) -> bool:
        """True if a single item of ``length`` tokens (and that output budget) exceeds the budget."""
        return not self.rule.fits_alone(length, output_budget)


# --------------------------------------------------------------------------------------------------
# The batch rule, checked at both ends
#
# The processor checks each batch it emits (``check_batch``: a violation is a bug, and it stops); the
# consumer checks each batch it receives (``contract_violation``: it rejects the items with the
# reason). They ask the same ``BatchRule`` and differ on purpose in one point: the processor pads to
# exactly ``round_up(longest, pad_multiple)``, while a consumer accepts any ``padded_length`` of at
# least the longest item, since padding more costs compute but breaks nothing the engine relies on.


class InvariantViolation(RuntimeError):
    """A batch was about to break the one-model-one-shape-one-lane rule or its contract."""


def check_batch(batch: Batch, contract: Contract) -> None:
    """Fail-stop check of a batch at the point of emission."""
    items = batch.items
    n = len(items)
    if not n:
        raise InvariantViolation(f"batch {batch.batch_id}: empty")
    model, shape, lane = batch.model, batch.shape, batch.lane
    longest = 0
    for it in items:  # a plain loop: batches are short, and it beats C passes that build sets
        if it.model != model or it.shape != shape or it.lane != lane:
            raise InvariantViolation(
                f"batch {batch.batch_id}: item {it.id!r} is model {it.model!r} shape {it.shape:#x} "
                f"lane {it.lane}, batch is model {model!r} shape {shape:#x} lane {lane}"
            )
        if it.length > longest:
            longest = it.length
    if batch.model != contract.model:
        raise InvariantViolation(
            f"batch {batch.batch_id}: model {batch.model!r} sent to a {contract.model!r} consumer"
        )
    if n > contract.max_items:
        raise InvariantViolation(f"batch {batch.batch_id}: {n} items > max_items {contract.max_items}")
    if batch.padded_length != round_up(longest, contract.pad_multiple):  # Contract.padded_length
        raise InvariantViolation(
            f"batch {batch.batch_id}: padded length {batch.padded_length} != round_up({longest}, "
            f"{contract.pad_multiple})"
        )
    rule = contract.rule
    outputs = sum(rule.output_tokens(it.output_budget) for it in items) if rule.counts_output else 0
    if n > 1 and not rule.fits(n, longest, outputs):
        raise InvariantViolation(
            f"batch {batch.batch_id}: {rule.load(n, longest, outputs)} {rule.load_unit} > "
            f"{rule.limit_name} {rule.limit}"
        )


class ItemView(Protocol):
    """What the consumer's check reads of an item: a decoded record or a batch head's item."""

    @property
    def model(self) -> str: ...
    @property
    def token_count(self) -> int: ...
    @property
    def output_budget(self) -> int | None: ...


class BatchView(Protocol):
    """What the consumer's check reads of a batch (``BatchRecord`` and ``BatchHead`` both are one)."""

    @property
    def consumer(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def padded_length(self) -> int: ...
    @property
    def items(self) -> Sequence[ItemView]: ...


def contract_violation(contract: Contract, batch: BatchView) -> str | None:
    """Why ``batch`` breaks ``contract``, or None when it respects it.

    The consumer checks its own promise rather than trusting the processor: a bug or a stale
    contract upstream must show up as rejected items with a reason, not as an engine that runs out
    of memory. A single item may exceed the budget (an oversized item always travels alone). The
    budget is the contract's batching rule (``Contract.rule``, the one dispatch packs by), measured
    at the batch's own ``padded_length``: that is what the engine will pad to.
    """
    n = len(batch.items)
    if batch.consumer != contract.consumer:
        return f"batch addressed to consumer {batch.consumer!r}, this is {contract.consumer!r}"
    if batch.model != contract.model:
        return f"batch model {batch.model!r}, contract model {contract.model!r}"
    if n > contract.max_items:
        return f"{n} items > contract max_items {contract.max_items}"
    longest = max((item.token_count for item in batch.items), default=0)
    if batch.padded_length < longest:
        return f"padded_length {batch.padded_length} < longest item {longest} tokens"
    mixed = sorted({item.model for item in batch.items if item.model != batch.model})
    if mixed:
        return f"items of model(s) {', '.join(mixed)} in a batch for {batch.model!r}"
    rule = contract.rule
    outputs = sum(rule.output_tokens(item.output_budget) for item in batch.items)
    if n > 1 and not rule.fits(n, batch.padded_length, outputs):
        return f"{rule.describe(n, batch.padded_length, outputs)} > contract {rule.limit_name} {rule.limit}"
    return None
