"""Embed tokenfabric's scheduler in your own service: no Kafka, no clock, one thread.

Run it from the repository root (or anywhere the package is installed):

    python examples/library/embed.py

A toy service takes requests from three prompt templates, hands batches to two GPU workers that
announced what they accept, applies what the workers answer, and prints the ledger and the
scheduler's view. docs/library.md walks through it; tests/core/test_library.py runs it and holds the
page to this file.
"""

from __future__ import annotations

import random

from processor.core import (
    Batch,
    Contract,
    DispatchSettings,
    Item,
    ItemOutcome,
    Scheduler,
    padding_waste,
    shape_signature,
)

MODEL = "llama-3-8b"
TEMPLATES = {  # a template's cacheable components make its shape: items of one shape share a prefix
    "support": ["You answer support tickets.", "Be brief."],
    "summary": ["Summarise the text below in one line."],
    "review": ["Rate the review from 1 to 5.", "Answer with the digit only."],
}


def requests(n: int, seed: int = 7) -> list[Item]:
    """``n`` requests: an id, the model, the template's shape, the prompt's length in tokens, and
    when it arrived (ms on the caller's clock). ``payload`` is yours: the core never reads it."""
    rng = random.Random(seed)
    names = sorted(TEMPLATES)
    out = []
    for i in range(n):
        name = rng.choice(names)
        out.append(
            Item(
                id=f"req-{i}",
                model=MODEL,
                shape=shape_signature(TEMPLATES[name]),
                length=rng.randint(50, 900),
                arrival_ms=i,
                payload={"template": name},
            )
        )
    return out


def run_on_worker(batch: Batch) -> list[ItemOutcome]:
    """Stands in for the GPU: every item succeeds but the first of batch ``b-3``; the engine reports a
    prefix-cache miss for the first two batches (nothing cached yet) and a hit after."""
    hit = batch.batch_id not in ("b-1", "b-2")
    return [
        ItemOutcome(it.id, ok=(batch.batch_id, k) != ("b-3", 0), cache_hit=hit)
        for k, it in enumerate(batch.items)
    ]


def main() -> None:
    scheduler = Scheduler(dispatch=DispatchSettings(max_wait_ms=5_000))

    # Each worker announces its contract: at most 4,096 padded tokens and 16 items per batch, every
    # item padded to a multiple of 8 tokens, at most 2 batches held at once.
    for worker in ("gpu-0", "gpu-1"):
        scheduler.set_contract(Contract(worker, MODEL, budget_tokens=4_096, max_items=16, max_inflight=2))

    items = requests(300)
    now_ms = 0
    scheduler.submit_many(items, [it.arrival_ms for it in items])

    while scheduler.view.waiting().items:
        now_ms += 100
        for batch in scheduler.dispatch(now_ms):  # every free slot filled: send each batch to its worker
            outcomes = run_on_worker(batch)  # in a real service the answers come back later
            _applied, finished = scheduler.items_done(batch.batch_id, outcomes, now_ms)
            assert finished  # every item answered: the worker's slot is free again
            scheduler.cache_reported(batch.consumer, hit=outcomes[0].cache_hit)
        scheduler.tick(now_ms)  # housekeeping: retire lanes that went quiet

    scheduler.check()  # the ledger balances against what the lanes and batches hold, or this raises
    view = scheduler.view
    completed, failed = view.total("completed"), view.total("failed")
    print(f"completed {completed.items} items ({completed.tokens:,} tokens), failed {failed.items}")
    for name, figures in view.consumers().items():
        book = view.consumer_book(name)  # nothing was handed back here, so routed is all it was sent
        waste = padding_waste(book.routed.tokens, book.padded_tokens) or 0.0
        hits, switches = f"{book.cache_hits}/{book.cache_lookups}", figures.shape_switches
        print(f"{name}: {book.batches} batches, waste {waste:.1%}, cache hits {hits}, switches {switches}")
    lanes = view.lanes()
    print(f"lanes: {lanes.new_lanes} opened over {lanes.shapes} shapes; {view.waiting().items} items wait")
    assert completed.items + failed.items == len(items) and failed.items == 1


if __name__ == "__main__":
    main()
