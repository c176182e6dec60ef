"""Decode and encode speed of the wire format (numbers quoted in docs/wire-format.md).

    .venv/bin/python benchmarks/bench_codec.py            # about a minute
    .venv/bin/python benchmarks/bench_codec.py --quick    # a few seconds, rougher
    .venv/bin/python benchmarks/bench_codec.py --requests # only with vs without a request

For 100, 1000 and 8000-token items it prints items/s for:

* ``hand``: ``decode_token_item``, the hand-written decoder of a whole record;
* ``fastavro``: ``decode_token_item_fastavro``, fastavro's schemaless_reader + the same checks;
* the processor's ingest head, ``fastpath.decode_item_head`` (the usual encoding read in one pass),
  against ``fastpath.general_item_head`` (a call per field, what any other encoding takes);
* a batch read by ``decode_batch`` and by ``fastpath.decode_batch_head`` (no token copied);
* ``fastavro array<int>``: the same TokenItem schema with ``tokens`` as ``array<int>`` instead of
  packed ``bytes``, read by fastavro (the design question: why tokens travel as bytes);
* ingest decode with a request against without one, side by side (``TokenItem.request``): the
  processor's head and the full decoder over a cycle of distinct messages, for a job-wide request
  (every item's request bytes equal), one with an adapter and a JSON schema, and a request per row
  (a seed of its own: every request's bytes differ, none is read from the cache of requests);
* registry-framed ingest (the Confluent wire format, processor/wire/registry_framing.py) against the
  single-object message of the same item, side by side, once the writer schema is cached: our own
  schema (spliced), our schema in a producer's namespace (spliced) and a producer's schema with one
  extra optional field (resolved by fastavro and written again) (``--registry``: only these);

then encode speeds. Token ids are random below 128,256 (a Llama-3-sized vocabulary), so varint
sizes in the array<int> variant are realistic. Each figure is the best of several timed runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import random
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, no install

import fastavro
from fastavro.schema import parse_schema

from processor.core.item import Batch, Item
from processor.core.signature import shape_signature, to_signed
from processor.wire import heads as fastpath
from processor.wire.fastavro_io import decode_token_item_fastavro, fastavro_decode
from processor.wire.items import decode_batch, decode_token_item, encode_batch, encode_token_item
from processor.wire.records import TokenItemRecord, new_token_item
from processor.wire.registry_framing import RegistryFraming, decode_ingest_head, frame
from processor.wire.request import GenerationRequest
from processor.wire.schemas import HEADER_SIZE, parsed_schema, schema_dir

SIZES = (100, 1000, 8000)
BATCH_SHAPES = ((32, 100), (8, 1000), (1, 8000))
VOCAB = 128_256


def rate(fn: Any, arg: Any, seconds: float, timer: Any = timeit.default_timer) -> float:
    """Calls per second of ``fn(arg)``: best of 5 runs of about ``seconds / 5`` each, timed by
    ``timer`` (wall-clock unless given)."""
    number = max(1, int(timeit.Timer(lambda: fn(arg), timer=timer).autorange()[0]))
    loops = max(1, int(number * (seconds / 5) / 0.2))
    best = min(timeit.repeat(lambda: fn(arg), number=loops, repeat=5, timer=timer))
    return loops / best


def sample_item(n: int, rng: random.Random) -> TokenItemRecord:
    components = ["You are a helpful assistant.", "tools: search, calculator"]
    return new_token_item(
        f"item-{rng.randrange(10**9):09d}",
        "llama-3-8b-instruct",
        [rng.randrange(VOCAB) for _ in range(n)],
        1_732_000_000_000 + rng.randrange(10**6),
        job_id="job-42",
        shape_components=None,
        shape=shape_signature(components),
        output_budget=512,
    )


def sample_batch(n_items: int, n: int, rng: random.Random) -> Batch:
    records = [sample_item(n, rng) for _ in range(n_items)]
    return Batch(
        batch_id="b-1",
        consumer="gpu-0",
        model=records[0].model,
        shape=records[0].shape,
        lane=0,
        pad_multiple=8,
        padded_length=n,
        items=[Item(r.item_id, r.model, r.shape, n, 0, payload=r) for r in records],
        created_ms=0,
    )


SCHEMA = (
    '{"type":"object","properties":{"label":{"enum":["positive","negative","neutral"]}},"required":["label"]}'
)

#: What an item's request may be, by the name the benchmark prints: a function of the item's index.
REQUESTS: dict[str, Any] = {
    "no request": lambda i: None,
    "job-wide request": lambda i: GenerationRequest(temperature=0.0, stop=("\n",)),
    "adapter + schema": lambda i: GenerationRequest(
        adapter="support-tone", temperature=0.0, json_schema=SCHEMA
    ),
    "per-row seed": lambda i: GenerationRequest(temperature=0.8, top_p=0.95, seed=i),
}

DISTINCT_MESSAGES = 4096
"""Messages cycled through per case: more than the cache of requests holds, so no per-row request
is ever answered from it (each has its own seed), as in a job of millions of rows."""


ROUNDS = 3
"""Each case is measured once per round, the cases in turn, and its best round kept: a machine
whose load changes over the run then changes every case's figures alike."""


def print_request_costs(rng: random.Random, seconds: float) -> None:
    """Ingest decode of items with a request against items without one (the first case), side by
    side: each case decodes the same items (ids, tokens, timestamps) and only the request differs.
    Timed in CPU time (``time.process_time``), so other processes on a shared machine count less."""
    print("\ningest decode with and without a request (TokenItem.request), items per CPU second;")
    print("ratio to no request; each case cycles through its own distinct messages")
    print(
        f"{'tokens':>7} {'request':<18} {'msg bytes':>9} {'head':>10} {'ratio':>6} {'full':>10} {'ratio':>6}"
    )
    for n in (100, 1000):
        base = [sample_item(n, rng) for _ in range(64)]
        cases = {
            name: [
                encode_token_item(dataclasses.replace(base[i % len(base)], request=request_of(i)))
                for i in range(DISTINCT_MESSAGES)
            ]
            for name, request_of in REQUESTS.items()
        }
        best = {name: (0.0, 0.0) for name in cases}
        for _round in range(ROUNDS):
            for name, messages in cases.items():
                head = cycled_rate(fastpath.decode_item_head, messages, seconds / ROUNDS)
                full = cycled_rate(decode_token_item, messages, seconds / ROUNDS)
                best[name] = (max(best[name][0], head), max(best[name][1], full))
        first_head, first_full = best["no request"]
        for name, (head, full) in best.items():
            print(
                f"{n:>7} {name:<18} {len(cases[name][0]):>9} {head:>10,.0f} {head / first_head:>5.2f}x"
                f" {full:>10,.0f} {full / first_full:>5.2f}x"
            )


def cycled_rate(fn: Any, messages: list[bytes], seconds: float) -> float:
    """Calls per CPU second of ``fn`` on ``messages`` in turn (:func:`rate` of a call on the next)."""
    turn = itertools.cycle(messages)
    return rate(lambda _: fn(next(turn)), None, seconds, time.process_time)


def print_registry_costs(rng: random.Random, seconds: float) -> None:
    """The processor's ingest decode of a registry-framed item vs the single-object one, per writer schema."""
    ours = json.loads((schema_dir() / "TokenItem.avsc").read_text(encoding="utf-8"))
    writers = {
        1: ours,
        2: {**ours, "namespace": "com.acme"},
        3: {
            **ours,
            "fields": [*ours["fields"], {"name": "team", "type": ["null", "string"], "default": None}],
        },
    }
    framing = RegistryFraming(_Writers({k: json.dumps(v) for k, v in writers.items()}))

    def framed_head(value: bytes) -> Any:  # what the processor's intake calls, a registry configured
        return decode_ingest_head(value, framing)

    print("\nregistry-framed ingest vs single-object (schema cached), items/s; ratio = cost framed / single")
    print(f"{'tokens':>7} {'single':>10} {'same schema':>12} {'ratio':>6} {'namespace':>10} {'ratio':>6}"
          f" {'+1 field':>10} {'ratio':>6}")  # fmt: skip
    for n in SIZES:
        value = encode_token_item(sample_item(n, rng))
        record = fastavro_decode(value, "TokenItem")
        single = rate(framed_head, value, seconds, time.process_time)  # the same call, a single-object item
        row = f"{n:>7} {single:>10,.0f}"
        for schema_id, width in ((1, 12), (2, 10), (3, 10)):
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parse_schema(writers[schema_id]), {**record, "team": "x"})
            framed = frame(schema_id, body.getvalue())
            assert framed_head(framed).item_id == record["item_id"]
            got = rate(framed_head, framed, seconds, time.process_time)
            row += f" {got:>{width},.0f} {single / got:>5.2f}x"
        print(row)


class _Writers:
    """Writer schemas by id, as a registry answers (the lookups are cached by the framing anyway)."""

    def __init__(self, schemas: dict[int, str]) -> None:
        self.schemas = schemas

    def schema_text(self, schema_id: int) -> str | None:
        return self.schemas.get(schema_id)


def array_int_schema() -> Any:
    raw = json.loads((schema_dir() / "TokenItem.avsc").read_text(encoding="utf-8"))
    raw["name"] = "TokenItemArrayInt"
    for field in raw["fields"]:
        if field["name"] == "tokens":
            field["type"] = {"type": "array", "items": "int"}
    return parse_schema(raw)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs, rougher numbers")
    parser.add_argument(
        "--requests", action="store_true", help="only ingest decode with vs without a request"
    )
    parser.add_argument(
        "--registry", action="store_true", help="only registry-framed vs single-object ingest decode"
    )
    args = parser.parse_args()
    seconds = 0.5 if args.quick else 3.0
    rng = random.Random(7)
    if args.requests:
        print(f"python {sys.version.split()[0]}")
        print_request_costs(rng, seconds)
        return
    if args.registry:
        print(f"python {sys.version.split()[0]}, fastavro {fastavro.__version__}")
        print_registry_costs(rng, seconds)
        return
    schema_ints = array_int_schema()

    print(f"python {sys.version.split()[0]}, fastavro {fastavro.__version__}")
    print("decode, items/s (higher is better)")
    print(f"{'tokens':>7} {'msg bytes':>9} {'hand':>10} {'fastavro':>10} {'hand/fa':>8}")
    bodies: list[tuple[int, bytes, bytes]] = []
    for n in SIZES:
        rec = sample_item(n, rng)
        value = encode_token_item(rec)
        assert decode_token_item(value) == decode_token_item_fastavro(value) == rec
        hand = rate(decode_token_item, value, seconds)
        fa = rate(decode_token_item_fastavro, value, seconds)
        print(f"{n:>7} {len(value):>9} {hand:>10,.0f} {fa:>10,.0f} {hand / fa:>7.2f}x")
        as_ints = {
            "item_id": rec.item_id,
            "job_id": rec.job_id,
            "model": rec.model,
            "shape": to_signed(rec.shape),
            "token_count": n,
            "tokens": list(rec.token_ids()),
            "shape_components": None,
            "produced_ms": rec.produced_ms,
            "output_budget": rec.output_budget,
            "metadata": None,
            "request": None,
        }
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema_ints, as_ints)
        bodies.append((n, value[HEADER_SIZE:], out.getvalue()))

    print("\nthe processor's ingest head (processor/wire/heads.py), items/s")
    print(f"{'tokens':>7} {'one pass':>10} {'general':>10} {'ratio':>7}")
    for n in SIZES:
        value = encode_token_item(sample_item(n, rng))
        assert fastpath._usual_head(value) == fastpath.general_item_head(value)
        usual = rate(fastpath.decode_item_head, value, seconds)
        general = rate(fastpath.general_item_head, value, seconds)
        print(f"{n:>7} {usual:>10,.0f} {general:>10,.0f} {usual / general:>6.2f}x")

    print_request_costs(rng, seconds)
    print_registry_costs(rng, seconds)

    print("\nreading a batch: decode_batch vs fastpath.decode_batch_head (no token copied), items/s")
    for n_items, n in BATCH_SHAPES:
        value = encode_batch(sample_batch(n_items, n, rng))
        full = rate(decode_batch, value, seconds) * n_items
        head = rate(fastpath.decode_batch_head, value, seconds) * n_items
        print(
            f"{n_items:>3} x {n:>5} tokens: decode_batch {full:>10,.0f}, "
            f"head {head:>10,.0f} ({head / full:.2f}x)"
        )

    print("\ntokens as bytes vs array<int>: fastavro schemaless_reader alone, items/s")
    print(
        f"{'tokens':>7} {'bytes':>10} {'array<int>':>10} {'ratio':>7}"
        f" {'body B (bytes)':>15} {'body B (ints)':>14}"
    )
    schema_bytes = parsed_schema("TokenItem")
    for n, body_bytes, body_ints in bodies:
        as_bytes = rate(
            lambda b: fastavro.schemaless_reader(io.BytesIO(b), schema_bytes, None, False),
            body_bytes,
            seconds,
        )
        as_ints_rate = rate(
            lambda b: fastavro.schemaless_reader(io.BytesIO(b), schema_ints, None, False), body_ints, seconds
        )
        print(
            f"{n:>7} {as_bytes:>10,.0f} {as_ints_rate:>10,.0f} {as_bytes / as_ints_rate:>6.1f}x"
            f" {len(body_bytes):>15} {len(body_ints):>14}"
        )

    print("\nencode, messages/s")
    for n in SIZES:
        rec = sample_item(n, rng)
        print(f"{n:>7} tokens: encode_token_item {rate(encode_token_item, rec, seconds):>10,.0f}")
    for n_items, n in BATCH_SHAPES:
        batch = sample_batch(n_items, n, rng)
        batches = rate(encode_batch, batch, seconds)
        print(
            f"{n_items:>3} x {n:>5} tokens: encode_batch {batches:>10,.0f} batches/s"
            f" = {batches * n_items:,.0f} items/s"
        )


if __name__ == "__main__":
    main()
