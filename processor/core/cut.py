"""Cutting one batch from one lane: which waiting items go together (the batch selection the lane
table's :meth:`~processor.core.lanes.LaneTable.take_batch` runs; it keeps the running totals).

Apart from lane storage (core/lanes.py: where an item waits) because it is the other idea: given a
lane and a consumer's batching rule, which items leave in one batch. Both cuts return the items in
batch order and the batch's longest length; the running totals are the table's to update.

- ``cut="length"`` (:func:`cut_by_length`): the longest items first, while they fit the rule and
  each pads by at most ``cut_tokens`` (and ``cut_ratio`` of its length) to the batch's longest, so
  items of nearly equal length go together however wide the lane is.
- ``cut="arrival"`` (:func:`cut_in_arrival_order`): from the head of the lane in arrival order (the
  first generation's rule).

Either way an item that does not fit the rule even alone leaves alone (an oversized batch), and an
``anchor`` (the deadline's overdue item) goes first whatever the order.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from processor.core.contract import BatchRule
from processor.core.item import Item

if TYPE_CHECKING:
    from processor.core.lanes import ByLength, LaneSettings


def cut_by_length(
    items: ByLength, rule: BatchRule, settings: LaneSettings, anchor: Item | None, leave_longer: bool
) -> tuple[list[Item], int]:
    """Take a batch from the longest lengths of ``items`` down (or from ``anchor``'s, the anchor
    first; or, ``leave_longer``, from the longest length whose oldest item fits alone)."""
    fits = rule.fits
    output_tokens = rule.output_tokens if rule.counts_output else None
    lengths = items.lengths
    buckets = items.buckets
    if anchor is not None:
        items.remove(anchor)
        taken = [anchor]
        top = bisect_right(lengths, anchor.length)  # the lengths below it, its own included
    else:
        top = len(lengths)
        if leave_longer and rule.longest_alone >= 0:  # outputs uncounted: whether one fits is its length
            top = max(1, bisect_right(lengths, rule.longest_alone))
        elif leave_longer:  # memory mode: the oldest item of each length down, until one fits
            while top > 1:
                first = buckets[lengths[top - 1]][0]
                if fits(1, first.length, _output(output_tokens, first)):
                    break
                top -= 1
        bucket = buckets[lengths[top - 1]]
        first = bucket[0]
        _drop_front(bucket, 1)
        items.n -= 1
        taken = [first]
    first = taken[0]
    longest = first.length
    outputs = _output(output_tokens, first)
    emptied = 0  # lengths lengths[top - emptied : top] that the cut empties
    if fits(1, longest, outputs):
        pm = rule.pad_multiple
        padded = -(-longest // pm) * pm
        floor = padded - min(settings.cut_tokens, settings.cut_ratio * longest)
        # outputs uncounted, the batch's size is known before it is cut: its longest item is first
        cap = rule.capacity(longest) if output_tokens is None else rule.max_items
        n = 1
        k = top
        while k > 0:
            length = lengths[k - 1]
            if -(-length // pm) * pm < floor:
                break
            bucket = buckets[length]
            if output_tokens is None:
                take = min(len(bucket), cap - n)
            else:
                take = 0
                for item in bucket:
                    candidate_outputs = outputs + output_tokens(item.output_budget)
                    if not fits(n + take + 1, longest, candidate_outputs):
                        break
                    outputs = candidate_outputs
                    take += 1
            if take:
                if type(bucket) is list:
                    taken += bucket[:take]
                    del bucket[:take]
                else:
                    popleft = cast(deque[Item], bucket).popleft
                    taken += [popleft() for _ in range(take)]
                n += take
            if bucket:
                break  # cut before the first item that does not fit
            emptied += 1
            k -= 1
        items.n -= n - 1
    elif anchor is None and not buckets[lengths[top - 1]]:
        emptied = 1  # the oversized first item was its length's last
    if emptied:
        for length in lengths[top - emptied : top]:
            del buckets[length]
        del lengths[top - emptied : top]
    return taken, longest


def cut_in_arrival_order(queue: deque[Item], rule: BatchRule, anchor: Item | None) -> tuple[list[Item], int]:
    """Take a batch from the head of ``queue`` (or from ``anchor`` on)."""
    taken: list[Item] = []
    fits = rule.fits
    output_tokens = rule.output_tokens if rule.counts_output else None
    longest = 0
    outputs = 0
    skip = 0 if anchor is None else queue.index(anchor)
    if skip:
        queue.rotate(-skip)
    left = len(queue) - skip
    while len(taken) < left:
        head = queue[0]
        candidate = head.length if head.length > longest else longest
        candidate_outputs = outputs if output_tokens is None else outputs + output_tokens(head.output_budget)
        if not fits(len(taken) + 1, candidate, candidate_outputs):
            break
        taken.append(queue.popleft())
        longest = candidate
        outputs = candidate_outputs
    if not taken:
        head = queue.popleft()
        taken.append(head)
        longest = head.length
    if skip:
        queue.rotate(skip)
    return taken, longest


def _output(output_tokens: Callable[[int | None], int] | None, item: Item) -> int:
    return 0 if output_tokens is None else output_tokens(item.output_budget)


def _drop_front(bucket: list[Item] | deque[Item], n: int) -> None:
    if type(bucket) is list:
        del bucket[:n]
    else:
        for _ in range(n):
            cast(deque[Item], bucket).popleft()
