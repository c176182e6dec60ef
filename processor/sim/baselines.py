"""What users would run instead of lanes, so the simulator can measure the difference side by side.

* ``FifoPolicy``: a plain queue per model; each batch takes items in arrival order while they fit the
  contract. Shapes and lengths mix freely (what a queue that hands a card "whatever arrived next" does).
* ``SortedWindowPolicy``: fairseq-style bucketing; the oldest ``window`` items of a model are sorted by
  length and cut greedily into batches, and the batch holding the oldest item goes out.
* ``OraclePolicy``: the offline bound for a backlog; everything sorted by (shape, length) once and
  packed in that order.

They share the contract's batching rule with lanes (``Contract.fits`` in whichever batching mode the
contract names; single oversized items go alone) and the same ledger, but only lanes promise one shape
per batch.

Adapters: the baselines key by the *base* model (``split_serving_key``), so a batch mixes the items
of every LoRA adapter of the model, and the base model's own. That is the honest baseline, not a
straw man: a server with multi-LoRA batching (vLLM ``--enable-lora``, S-LoRA, Punica) runs mixed
adapters in one forward pass, and what it loses is the prefix cache, which is per adapter (the
simulator's cache keys are ``(serving key, shape)``). The consumers' contracts name serving keys; here
each is taken as a multi-LoRA server of its base model, and a batch is booked under the base model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from sortedcontainers import SortedKeyList

from processor.core.accounting import Ledger, Tally
from processor.core.contract import Contract
from processor.core.item import NO_LANE, Batch, Item
from processor.core.serving import split_serving_key


def pack_prefix(items: Sequence[Item], contract: Contract) -> int:
    """How many of ``items``, taken in order, fit one batch of ``contract`` (at least one)."""
    rule = contract.rule
    longest = 0
    outputs = 0
    n = 0
    for item in items:
        candidate = max(longest, item.length)
        candidate_outputs = outputs + rule.output_tokens(item.output_budget)
        if not rule.fits(n + 1, candidate, candidate_outputs):
            break
        longest = candidate
        outputs = candidate_outputs
        n += 1
    return max(n, 1) if items else 0


class Totals(Protocol):
    """A policy's totals per ledger stage (``SchedulerView.total``, ``Ledger.total``)."""

    def total(self, stage: str) -> Tally: ...


class QueuePolicy:
    """Shared bookkeeping of the baselines: contracts, in-flight slots, the ledger, batch ids."""

    name = "queue"

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.ledger = ledger or Ledger()
        self.contracts: dict[str, Contract] = {}
        self.in_flight: dict[str, dict[str, Batch]] = {}
        self.waiting_items = 0
        self.waiting_tokens = 0
        self.oversized = 0
        self._seq = 0
        self._bases: dict[str, str] = {}

    @property
    def view(self) -> Ledger:
        """What the simulator reads of a policy (``total(stage)``): the scheduler's view, the ledger here."""
        return self.ledger

    def check(self) -> None:
        self.ledger.check()

    def base_model(self, key: str) -> str:
        """The model of serving key ``key``: what the baselines queue, batch and book by."""
        base = self._bases.get(key)
        if base is None:
            base = self._bases[key] = split_serving_key(key)[0]
        return base

    def set_contract(self, contract: Contract) -> None:
        self.contracts[contract.consumer] = contract
        self.in_flight.setdefault(contract.consumer, {})

    def submit(self, item: Item, now_ms: int) -> None:
        self.ledger.received(self.base_model(item.model), item.length)
        self.waiting_items += 1
        self.waiting_tokens += item.length
        self._push(item)

    def submit_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        for item, now_ms in zip(items, times, strict=True):
            self.submit(item, now_ms)

    def dispatch(self, now_ms: int) -> list[Batch]:
        out: list[Batch] = []
        progress = True
        while progress:
            progress = False
            for name, contract in self.contracts.items():
                if len(self.in_flight[name]) >= contract.max_inflight:
                    continue
                items = self._take(contract)
                if items:
                    out.append(self._emit(contract, items, now_ms))
                    progress = True
        return out

    def complete(self, batch_id: str, now_ms: int) -> Batch | None:
        for flights in self.in_flight.values():
            batch = flights.pop(batch_id, None)
            if batch is not None:
                self.ledger.finished(batch.model, batch.consumer, len(batch.items), batch.real_tokens, 0, 0)
                return batch
        return None

    def tick(self, now_ms: int) -> int:
        return 0

    def _emit(self, contract: Contract, items: list[Item], now_ms: int) -> Batch:
        self._seq += 1
        padded = contract.padded_length(max(it.length for it in items))
        oversized = len(items) == 1 and contract.is_oversized(items[0].length, items[0].output_budget)
        model = self.base_model(contract.model)
        batch = Batch(
            f"{self.name}-{self._seq}",
            contract.consumer,
            model,
            items[0].shape,
            NO_LANE,
            contract.pad_multiple,
            padded,
            items,
            now_ms,
            oversized,
        )
        tokens = batch.real_tokens
        self.waiting_items -= len(items)
        self.waiting_tokens -= tokens
        self.oversized += oversized
        for it in items:
            it.dispatched = True
        self.in_flight[contract.consumer][batch.batch_id] = batch
        self.ledger.routed(model, contract.consumer, len(items), tokens, batch.padded_tokens, oversized)
        return batch

    def _push(self, item: Item) -> None:
        raise NotImplementedError

    def _take(self, contract: Contract) -> list[Item]:
        raise NotImplementedError


class FifoPolicy(QueuePolicy):
    name = "fifo"

    def __init__(self, ledger: Ledger | None = None) -> None:
        super().__init__(ledger)
        self.queues: dict[str, deque[Item]] = {}

    def _push(self, item: Item) -> None:
        self.queues.setdefault(self.base_model(item.model), deque()).append(item)

    def _take(self, contract: Contract) -> list[Item]:
        queue = self.queues.get(self.base_model(contract.model))
        if not queue:
            return []
        n = pack_prefix([queue[i] for i in range(min(len(queue), contract.max_items))], contract)
        return [queue.popleft() for _ in range(n)]


class SortedWindowPolicy(FifoPolicy):
    name = "sorted-window"

    def __init__(self, window: int = 1024, ledger: Ledger | None = None) -> None:
        super().__init__(ledger)
        if window < 1:
            raise ValueError(f"--window must be >= 1, got {window}")
        self.window = window

    def _take(self, contract: Contract) -> list[Item]:
        queue = self.queues.get(self.base_model(contract.model))
        if not queue:
            return []
        window = [queue.popleft() for _ in range(min(self.window, len(queue)))]
        oldest = window[0]
        ordered = sorted(window, key=_length)
        start = 0
        chosen: list[Item] = []
        while start < len(ordered):
            n = pack_prefix(ordered[start : start + contract.max_items], contract)
            chunk = ordered[start : start + n]
            if any(it is oldest for it in chunk):
                chosen = chunk
                break
            start += n
        taken = {id(it) for it in chosen}
        queue.extendleft(reversed([it for it in window if id(it) not in taken]))
        return chosen


class OraclePolicy(QueuePolicy):
    name = "oracle"

    def __init__(self, ledger: Ledger | None = None, key: Callable[[Item], object] | None = None) -> None:
        super().__init__(ledger)
        self.sorted: dict[str, SortedKeyList] = {}
        # By serving key first: an oracle's batch is one adapter's, the order it caches best.
        self._key = key or (lambda it: (it.model, it.shape, it.length))

    def _push(self, item: Item) -> None:
        base = self.base_model(item.model)
        bucket = self.sorted.get(base)
        if bucket is None:
            bucket = self.sorted[base] = SortedKeyList(key=self._key)
        bucket.add(item)

    def _take(self, contract: Contract) -> list[Item]:
        bucket = self.sorted.get(self.base_model(contract.model))
        if not bucket:
            return []
        head = list(bucket.islice(0, contract.max_items))
        # An oracle never mixes shapes, nor adapters: cut the run at the first change of either.
        first = head[0]
        stop = next(
            (i for i, it in enumerate(head) if it.shape != first.shape or it.model != first.model), len(head)
        )
        n = pack_prefix(head[:stop], contract)
        taken = head[:n]
        del bucket[:n]
        return taken


def _length(item: Item) -> int:
    return item.length
