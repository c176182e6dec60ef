"""Cutting one batch from one lane: which waiting items go together (the batch selection the lane
table's :meth:`~processor.core.lanes.LaneTable.take_batch` runs; it keeps the running totals).

Apart from lane storage (core/lanes.py: where an item waits) because it is the other idea: given a
lane and a consumer's batching rule, which items leave in one batch. Both cuts return the items in
batch order and the batch's padded length (its longest item's, rounded up to the rule's
``pad_multiple``); the running totals are the table's to update.

- ``cut="length"`` (:func:`cut_by_length`): from the lane's *sweep* down, while the items fit the rule
  and each pads by at most ``cut_tokens`` (and ``cut_ratio`` of its length) to the batch's longest, so
  items of nearly equal length go together however wide the lane is. The sweep
  (``ByLength.sweep``): a batch starts at the longest length at or below the shortest item of the
  lane's previous batch, and at the longest when nothing waits there (the sweep wraps). Each pass goes
  down the lengths once, so in streaming a short item is passed at most once per pass by longer items
  that arrive after it (issue 25: longest first at every batch doubled the wait tail of bursts).
  A batch cut around an anchor, or started lower to leave longer items to a bigger consumer
  (``leave_longer``), does not move the sweep. Invariant: with no item placed after the lane's first
  batch (a backlog), no waiting item is longer than the sweep, so every batch starts at the longest
  waiting item (the rule before the sweep, batch for batch).
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
    from processor.core.lane import ByLength
    from processor.core.lane_settings import LaneSettings


def cut_by_length(
    items: ByLength, rule: BatchRule, settings: LaneSettings, anchor: Item | None, leave_longer: bool
) -> tuple[list[Item], int]:
    """Take a batch from the longest length at or below the sweep down (or from ``anchor``'s, the
    anchor first; or, ``leave_longer``, from no higher than the longest length whose oldest item fits
    alone); a batch that started at the sweep moves it to the batch's shortest item."""
    output_tokens = rule.output_tokens if rule.counts_output else None  # rule.fits: asked then only
    lengths = items.lengths
    buckets = items.buckets
    if anchor is not None:
        items.remove(anchor)
        first = anchor
        taken = [anchor]
        top = bisect_right(lengths, anchor.length)  # the lengths below it, its own included
        moves_sweep = False
    else:
        swept = bisect_right(lengths, items.sweep) or len(lengths)  # nothing at or below it: wrap
        top = swept
        if leave_longer and rule.longest_alone >= 0:  # outputs uncounted: whether one fits is its length
            top = min(top, max(1, bisect_right(lengths, rule.longest_alone)))
        elif leave_longer:  # memory mode: the oldest item of each length down, until one fits
            while top > 1:
                first = buckets[lengths[top - 1]][0]
                if rule.fits(1, first.length, _output(output_tokens, first)):
                    break
                top -= 1
        moves_sweep = top == swept
        bucket = buckets[lengths[top - 1]]
        first = bucket.pop(0) if type(bucket) is list else cast(deque[Item], bucket).popleft()
        items.n -= 1
        taken = [first]
    longest = first.length
    outputs = 0 if output_tokens is None else output_tokens(first.output_budget)
    k = top  # lengths[k:top] are the lengths the cut empties
    if longest <= rule.longest_alone if output_tokens is None else rule.fits(1, longest, outputs):
        pm = rule.pad_multiple
        padded = -(-longest // pm) * pm or pm  # round_up, inlined (once per batch)
        ratio = settings.cut_ratio * longest
        cut_tokens = settings.cut_tokens
        floor = padded - (ratio if ratio < cut_tokens else cut_tokens)  # min(cut_tokens, ratio)
        # outputs uncounted, the batch's size is known before it is cut (its longest item is first):
        # rule.capacity(longest), asked only once a second item may join (most streaming batches
        # hold one)
        cap = -1
        n = 1
        while k > 0:
            length = lengths[k - 1]
            if -(-length // pm) * pm < floor:
                break
            bucket = buckets[length]
            if bucket:  # the first item's length may be empty already: nothing to take there
                if output_tokens is None:
                    if cap < 0:
                        cap = rule.capacity(longest)
                    room = cap - n
                    take = room if room < len(bucket) else len(bucket)  # min(len(bucket), room)
                else:
                    take = 0
                    for item in bucket:
                        candidate_outputs = outputs + output_tokens(item.output_budget)
                        if not rule.fits(n + take + 1, longest, candidate_outputs):
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
            del buckets[length]
            k -= 1
        if n > 1:
            items.n -= n - 1
    else:
        padded = rule.padded_length(longest)
        if anchor is None and not buckets[lengths[top - 1]]:
            k = top - 1  # the oversized first item was its length's last
            del buckets[lengths[k]]
    if k == top - 1:  # the common case: the batch emptied one length
        del lengths[k]
    elif k < top:
        del lengths[k:top]
    if moves_sweep:
        items.sweep = taken[-1].length  # the shortest taken: what is left of its length goes next
    return taken, padded


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
    return taken, rule.padded_length(longest)


def _output(output_tokens: Callable[[int | None], int] | None, item: Item) -> int:
    return 0 if output_tokens is None else output_tokens(item.output_budget)
