"""One bad row fails alone: split a refused multi-prompt request until the prompts the server refuses
are isolated, so the others complete.

Why: a server validates every prompt of a request before it runs any, and refuses the whole request
with one 4xx when one prompt is bad (llama.cpp: ``400 Prompt contains invalid tokens`` for an id out
of its vocabulary, ``400 ... exceeds the available context size`` for a prompt too long; vLLM: 400 for
a prompt over ``max_model_len``). Without splitting, one bad row fails every row sent with it.

What may be split is decided by the status (:func:`belongs_to_a_prompt`): 400, 413 and 422 say
"this body is wrong", which one prompt can cause. 401/403 (credentials), 404 (wrong URL or model),
429 and 5xx (load, a server down) and a connection that fails say nothing about any one prompt: the
request's items fail at once, without splitting, so a server that is down costs one failed request,
not one per item.

Invariants of :func:`isolate`: every item gets exactly one result, in order; an item fails with a
refusal only when a request holding it alone was refused; halves are sent one after the other
(a batch of n items with one bad row costs at most ``2 * ceil(log2 n) + 1`` requests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

SPLITTABLE_STATUSES = frozenset({400, 413, 422})
"""HTTP statuses that refuse a request for what is in its body, which one prompt can cause."""


def belongs_to_a_prompt(status: int) -> bool:
    """True when a refusal with ``status`` may be one prompt's fault, so splitting can isolate it."""
    return status in SPLITTABLE_STATUSES


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the server refused for a reason that may belong to one of its prompts.

    ``reason`` names the endpoint, the status and the server's message: it becomes the reason of the
    item a request of one prompt was refused for.
    """

    status: int
    reason: str


def isolate(
    items: Sequence[Item],
    send: Callable[[Sequence[Item]], list[Result] | Refusal],
    refused: Callable[[Item, Refusal, int], Result],
    *,
    sent: int | None = None,
) -> list[Result]:
    """Results for ``items``: ``send`` them as one request; on a :class:`Refusal`, send each half the
    same way, until a refused request holds one item, which gets ``refused(item, refusal, sent)``
    (``sent``: how many prompts the first request carried; the recursion passes it down).

    ``send`` answers every item itself for anything but a refusal (a success, or a failure splitting
    cannot help: it returns failed results), so those never split.
    """
    sent = len(items) if sent is None else sent
    answer = send(items)
    if not isinstance(answer, Refusal):
        return answer
    if len(items) == 1:
        return [refused(items[0], answer, sent)]
    middle = len(items) // 2
    return isolate(items[:middle], send, refused, sent=sent) + isolate(
        items[middle:], send, refused, sent=sent
    )
