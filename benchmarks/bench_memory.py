"""Resident memory per waiting item and per waiting token, items held exactly as the processor holds them.

    python benchmarks/bench_memory.py                    # 1,000,000 items of 100 and of 1,000 tokens
    python benchmarks/bench_memory.py --smoke            # 20,000 items of each
    python benchmarks/bench_memory.py --items N --tokens 100,1000

No Kafka: each item is what ``ProcessorService._ingest`` builds from a message: the bytes a producer
would send (``encode_token_item``), decoded by the hot-path decoder into a ``TokenItemRecord`` (its own
``tokens`` bytes, id and model strings), wrapped in an ``IngestItem`` and submitted to a ``Scheduler``
with the processor's default settings. The encoded message is dropped once decoded, as the consumer's
message is. No consumer is registered, so everything waits.

Measured: ``VmRSS`` from /proc/self/status before and after (after ``gc.collect()``), in a fresh
process per size so that one size's freed memory does not flatter the next. The target is
``<= 1.3 x raw token bytes + 300 B`` per item (raw = 4 bytes per token, the packed uint32 ids).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.apps.producer import synthetic_tokens
from processor.apps.settings import ProcessorSettings
from processor.core.scheduler import Scheduler
from processor.core.signature import shape_signature
from processor.state.ingest import IngestItem
from processor.wire.heads import decode_item_head
from processor.wire.items import encode_token_item
from processor.wire.records import TokenItemRecord

FULL_ITEMS = 1_000_000
SMOKE_ITEMS = 20_000
SIZES = (100, 1000)
MODEL = "llama-3-8b-instruct"
PARTITIONS = 6
TARGET_FACTOR = 1.3
TARGET_PER_ITEM_B = 300


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def message(i: int, tokens: int, rng: random.Random, shapes: list[int]) -> bytes:
    """One ingest message as a producer sends it (lengths +-10% around ``tokens``)."""
    item_id = f"req-{i:010d}"
    length = rng.randint(round(tokens * 0.9), round(tokens * 1.1))
    rec = TokenItemRecord(
        item_id=item_id,
        model=MODEL,
        shape=rng.choice(shapes),
        token_count=length,
        tokens=synthetic_tokens(item_id, length),
        produced_ms=1_764_000_000_000 + i,
    )
    return encode_token_item(rec)


def measure(items: int, tokens: int, shapes: int = 8, seed: int = 1) -> dict[str, Any]:
    """Fill a scheduler with ``items`` waiting items; RSS before and after."""
    settings = ProcessorSettings()
    rng = random.Random(seed)
    signatures = [shape_signature([f"bench-shape-{k}"]) for k in range(shapes)]
    synthetic_tokens("warm-up", 1)  # the 8 MiB token block is the producer's, not the processor's
    core = Scheduler(settings.lanes, settings.dispatch, batch_prefix="bench")
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    raw = 0
    for i in range(items):
        head = decode_item_head(message(i, tokens, rng, signatures))
        item = IngestItem.from_head(head, i // 1000, i % PARTITIONS, i // PARTITIONS)
        core.submit(item, item.arrival_ms)
        raw += 4 * head.token_count
    gc.collect()
    after = rss_bytes()
    core.check(deep=True)
    assert core.view.waiting().items == items
    delta = after - before
    return {
        "items": items,
        "tokens_per_item": tokens,
        "waiting_tokens": core.view.waiting().tokens,
        "raw_token_bytes": raw,
        "rss_delta_bytes": delta,
        "bytes_per_item": delta / items,
        "bytes_per_token": delta / core.view.waiting().tokens,
        "overhead_per_item": (delta - raw) / items,
        "allowed_per_item": (TARGET_FACTOR * raw + TARGET_PER_ITEM_B * items) / items,
        "lanes": sum(len(sl.lanes) for sl in core._context.table.shapes.values()),
        "fill_seconds": time.perf_counter() - started,
        "breakdown": breakdown(core),
    }


def breakdown(core: Scheduler) -> dict[str, int]:
    """``sys.getsizeof`` of one waiting item's own objects (shared and cached objects excluded)."""
    lane = next(
        lane for sl in core._context.table.shapes.values() for lane in sl.lanes.values() if lane.items
    )
    item = lane.head()
    body: bytes = item.payload
    ints = [item.shape, item.length, item.offset, item.arrival_ms]
    return {
        "IngestItem": sys.getsizeof(item),
        "message body bytes (tokens and all)": sys.getsizeof(body),
        "item_id str": sys.getsizeof(item.id),
        "model str (a copy per item)": sys.getsizeof(item.model) if item.model is not MODEL else 0,
        "ints (shape, count, offset, arrival)": sum(sys.getsizeof(n) for n in ints if not -5 <= n <= 256),
    }


def run_child(items: int, tokens: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter, so that every size starts from the same baseline."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--items", str(items), "--tokens", str(tokens)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| tokens/item | waiting items | raw token bytes/item | RSS bytes/item | RSS bytes/token "
        "| overhead bytes/item (RSS - raw) | allowed bytes/item (1.3 x raw + 300) | measured / allowed |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| ~{r['tokens_per_item']:,} | {r['items']:,} | {r['raw_token_bytes'] / r['items']:,.0f} "
            f"| {r['bytes_per_item']:,.0f} | {r['bytes_per_token']:.2f} | {r['overhead_per_item']:,.0f} "
            f"| {r['allowed_per_item']:,.0f} | {r['bytes_per_item'] / r['allowed_per_item']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE_ITEMS:,} items per size")
    p.add_argument("--items", type=int, help=f"waiting items per size (default {FULL_ITEMS:,})")
    p.add_argument("--tokens", default=",".join(map(str, SIZES)), help="tokens per item, comma-separated")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    items = args.items or (SMOKE_ITEMS if args.smoke else FULL_ITEMS)
    sizes = [int(t) for t in args.tokens.split(",")]
    if args.child:
        print(json.dumps(measure(items, sizes[0])))
        return 0
    results = [run_child(items, tokens) for tokens in sizes]
    print(table(results))
    print("\nOne item's own objects (sys.getsizeof, bytes):")
    for r in results:
        print(f"  {r['tokens_per_item']:,} tokens: {r['breakdown']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
