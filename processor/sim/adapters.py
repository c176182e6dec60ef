"""Give a trace's requests LoRA adapters, so the simulator can measure what adapters do to batching.

No public trace names adapters, so a share of the requests is given each adapter at random (seeded:
one (trace, shares, seed) names one exact trace): ``with_adapters``. Each request is drawn on its
own, whatever its shape, which is the case adapters matter in: tenants that share a system prompt
but run their own adapter, so one prefix is cached once per adapter.

``python -m processor.sim.adapters`` writes such a copy of any trace in the native format, which
``tokenfabric simulate`` reads (docs/simulator.md, Adapters, has the command and its figures).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from processor.core.serving import SEPARATOR
from processor.sim.tracegen import write_jsonl
from processor.sim.traces import FORMATS, SHIPPED, TraceRecord, read_trace, shipped_trace


def with_adapters(
    records: Sequence[TraceRecord], shares: Mapping[str, float], seed: int
) -> list[TraceRecord]:
    """``records`` with each one's ``adapter`` drawn from ``shares`` (adapter name -> share of the
    requests, summing to at most 1; the rest stay base-model requests). Raises ``ValueError`` for a
    share outside [0, 1], shares summing past 1, or a name that is empty or holds the separator."""
    for name, share in shares.items():
        if not name or SEPARATOR in name:
            raise ValueError(f"adapter {name!r}: a name without {SEPARATOR!r} is needed")
        if not 0 <= share <= 1:
            raise ValueError(f"adapter {name}: share {share} is not in [0, 1]")
    base = 1 - sum(shares.values())
    if base < -1e-9:
        raise ValueError(f"the adapters' shares sum to {1 - base:g}, past 1")
    names = ["", *shares]
    weights = [max(0.0, base), *shares.values()]
    drawn = random.Random(seed).choices(names, weights=weights, k=len(records))
    return [msgspec.structs.replace(r, adapter=a) if a else r for r, a in zip(records, drawn, strict=True)]


def _shares(pairs: Sequence[str]) -> dict[str, float]:
    """``--adapter NAME=SHARE`` values as a mapping (``with_adapters`` checks names and shares)."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, _eq, share = pair.partition("=")
        try:
            out[name] = float(share)  # "" (no "=") is refused here too
        except ValueError:
            raise ValueError(f"--adapter {pair!r}: expected NAME=SHARE, e.g. support-tone=0.3") from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m processor.sim.adapters", description=__doc__.split("\n")[0])
    p.add_argument("--trace", required=True, help=f"trace file, or a shipped trace: {', '.join(SHIPPED)}")
    p.add_argument("--format", default="jsonl", choices=FORMATS, help="trace format (default: jsonl)")
    p.add_argument("--limit", type=int, help="read at most this many records")
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=SHARE",
        help="an adapter and its share (repeatable)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default: 0)")
    p.add_argument("--out", required=True, help="where to write the native jsonl trace (.gz: gzipped)")
    args = p.parse_args(argv)
    try:
        shipped = args.trace in SHIPPED
        path = shipped_trace(args.trace) if shipped else Path(args.trace)
        fmt = SHIPPED[args.trace][1] if shipped else args.format
        records = read_trace(path, fmt, limit=args.limit)
        out = write_jsonl(with_adapters(records, _shares(args.adapter), args.seed), args.out)
    except ValueError as exc:  # TraceError is one
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(records):,} records to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
