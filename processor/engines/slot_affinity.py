"""Shape-to-slot affinity for llama.cpp's server: the items of a shape go to the slot holding its prefix.

Why: each llama-server slot keeps its own KV cache and reuses only the common prefix with its own
previous prompt, so a batch of one shape spread over 4 slots computes that prefix up to 4 times per
server. llama.cpp lets a request name its slot (``id_slot``); a request for a busy slot waits for it
(the server defers the task), so the items of one shape run one after the other in one slot and the
prefix is computed once per server until that slot is given to another shape. vLLM and SGLang share
one prefix cache per server (paged KV blocks, radix tree), so they need none (docs/engine-openai.md).

Policy: a shape keeps its slot while it holds one; a shape without one takes the least recently used
slot (its previous shape loses it). Invariant: :meth:`slot` always returns ``0 <= slot < slots``, and
two shapes never hold the same slot at once. Thread-safe: the engine plans a batch on one thread, but
a consumer may plan batches of several threads against one server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class SlotAffinity:
    """Which of a server's ``slots`` slots each shape's items go to (least recently used is reused)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slot affinity needs at least 1 slot, got {slots}")
        self.slots = slots
        self._held: OrderedDict[int, int] = OrderedDict()  # shape -> slot, least recently used first
        self._lock = threading.Lock()

    def slot(self, shape: int) -> int:
        """The slot for ``shape``'s next item; marks it the most recently used."""
        with self._lock:
            if shape in self._held:
                self._held.move_to_end(shape)
                return self._held[shape]
            if len(self._held) < self.slots:
                taken = set(self._held.values())
                free = next(s for s in range(self.slots) if s not in taken)
            else:
                _evicted, free = self._held.popitem(last=False)
            self._held[shape] = free
            return free
