"""Lanes against FIFO batching on real compute: the ``embed`` engine (numpy MiniLM-L6) on the CPU.

    .venv/bin/python benchmarks/bench_embed.py            # full size, about 12 minutes
    .venv/bin/python benchmarks/bench_embed.py --smoke    # under 30 s, rough, writes no file

BLAS runs on one thread unless ``OPENBLAS_NUM_THREADS`` is set (see the comment at the imports).

Prompt lengths are those of a shipped trace (``azure_code`` by default), keeping the prompts the
model can take (<= 512 tokens) in arrival order. Each prompt becomes ``[CLS]`` + random word-piece
ids + ``[SEP]`` of exactly that length (seeded, so both policies embed the same token sequences).

Batches are formed once per policy by the simulator (:func:`processor.sim.simulator.simulate`) from a
backlog: ``lanes`` is the real :class:`~processor.core.scheduler.Scheduler`, ``fifo`` the
:class:`~processor.sim.baselines.FifoPolicy`, both under the same contract (one consumer, budget 4,096
padded tokens, at most 32 items, pad multiple 8, one batch in flight). Then the embed engine runs
every batch of each policy, policies alternating, ``--reps`` times; only the engine's ``run`` calls
are timed. Reported: real prompt tokens per second of forward-pass wall time (median and range over
repetitions), padded tokens, padding waste, and the lanes/fifo ratio. As a check that the
comparison is fair, the embeddings each policy produced for the same item are compared.

The table is printed and, for a full run, written to ``docs/benchmarks-embed.md`` with the machine
and the exact command. Like every benchmark here it asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, no install
# One BLAS thread unless the caller says otherwise, set before numpy loads OpenBLAS: on a shared 2-core
# machine two threads ran a batch anywhere from 4,300 down to 370 tokens/s, one thread at 3,300-3,400.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from processor.core.contract import Contract
from processor.core.measures import padding_waste
from processor.engines.embed import EmbedEngine, from_options
from processor.sim.cardmodel import CardSpec
from processor.sim.simulator import ConsumerSpec, simulate
from processor.sim.traces import SHIPPED, TraceRecord, read_shipped
from processor.wire.records import BatchRecord, TokenItemRecord, tokens_from_ids

POLICIES = ("lanes", "fifo")
MODEL = "default"
CLS, SEP = 101, 102
WORDPIECES = (1996, 29612)  # ordinary whole-word ids of the uncased BERT vocabulary ("the" ... )
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks-embed.md"


@dataclass(slots=True)
class Run:
    """One policy's pass over all its batches."""

    seconds: float
    real_tokens: int
    padded_tokens: int

    @property
    def real_per_s(self) -> float:
        return self.real_tokens / self.seconds


@dataclass(slots=True)
class PolicyResult:
    batches: list[BatchRecord]
    runs: list[Run] = field(default_factory=list)
    outputs: dict[str, bytes] = field(default_factory=dict)

    @property
    def real_tokens(self) -> int:
        return sum(it.token_count for b in self.batches for it in b.items)

    @property
    def padded_tokens(self) -> int:
        return self.runs[0].padded_tokens

    @property
    def padding_waste(self) -> float:
        return padding_waste(self.real_tokens, self.padded_tokens) or 0.0

    def median_real_per_s(self) -> float:
        return statistics.median(r.real_per_s for r in self.runs)


def prompts(trace: str, items: int, max_positions: int) -> list[TraceRecord]:
    """The first ``items`` records of ``trace`` (0 = all) that the model can take, in arrival order."""
    fitting = [r for r in read_shipped(trace) if r.length <= max_positions]
    return fitting[:items] if items else fitting


def token_bytes(records: list[TraceRecord], seed: int) -> dict[str, bytes]:
    """``[CLS] random word pieces [SEP]`` of each record's length, packed as the wire carries them."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in records:
        body = rng.integers(*WORDPIECES, size=max(r.length - 2, 0)).tolist()
        ids = [CLS, *body, SEP][: r.length]
        out[r.id] = tokens_from_ids(ids)
    return out


def form_batches(
    records: list[TraceRecord], policy: str, contract: Contract, tokens: dict[str, bytes]
) -> list[BatchRecord]:
    """The batches ``policy`` emits for ``records`` as a backlog, as BatchRecords the engine reads."""
    # Card speed only sets virtual time; with a backlog and no cache it does not change any batch.
    spec = ConsumerSpec(contract, CardSpec(tokens_per_s=5_000.0, overhead_ms=0.0, cache=0))
    emitted = io.StringIO()
    simulate(records, [spec], policy, backlog=True, emit=emitted)
    batches = []
    for line in emitted.getvalue().splitlines():
        b = json.loads(line)
        items = [
            TokenItemRecord(
                item_id=item_id,
                model=b["model"],
                shape=b["shape"],
                token_count=length,
                tokens=tokens[item_id],
                produced_ms=0,
            )
            for item_id, length in b["items"]
        ]
        batches.append(
            BatchRecord(
                batch_id=b["batch_id"],
                consumer=b["consumer"],
                model=b["model"],
                shape=b["shape"],
                lane=b["lane"],
                padded_length=b["padded_length"],
                pad_multiple=contract.pad_multiple,
                created_ms=b["t_ms"],
                items=items,
            )
        )
    return batches


def run_policy(engine: EmbedEngine, result: PolicyResult, keep_outputs: bool) -> Run:
    seconds = 0.0
    real = padded = 0
    for batch in result.batches:
        start = time.perf_counter()
        outcome = engine.run(batch)
        seconds += time.perf_counter() - start
        real += engine.last_real_tokens
        padded += engine.last_padded_tokens
        bad = [r for r in outcome if r.status != "ok"]
        if bad:
            raise RuntimeError(
                f"batch {batch.batch_id}: item {bad[0].item_id} {bad[0].status}: {bad[0].reason}"
            )
        if keep_outputs:
            result.outputs.update((r.item_id, r.output) for r in outcome)
    return Run(seconds, real, padded)


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = "unknown"
    try:
        config: Any = np.show_config(mode="dicts")
        info = config["Build Dependencies"]["blas"]
        blas = f"{info['name']} {info['version']}"
    except Exception:  # older numpy: no dict mode
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": str(cores),
        "cpu": cpu,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas,
        "blas threads": os.environ.get("OPENBLAS_NUM_THREADS", "BLAS default (OPENBLAS_NUM_THREADS unset)"),
    }


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}"


def render(results: dict[str, PolicyResult], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    lanes, fifo = results["lanes"], results["fifo"]
    paired = [a.real_per_s / b.real_per_s for a, b in zip(lanes.runs, fifo.runs, strict=True)]
    rows = [
        "| policy | batches | real tokens | padded tokens | padding waste | forward s (median) "
        "| real tokens/s median (min-max) | padded tokens/s (median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        secs = [run.seconds for run in r.runs]
        rates = [run.real_per_s for run in r.runs]
        padded_rate = statistics.median(run.padded_tokens / run.seconds for run in r.runs)
        rows.append(
            f"| {name} | {len(r.batches):,} | {r.real_tokens:,} | {r.padded_tokens:,} "
            f"| {r.padding_waste:.1%} "
            f"| {statistics.median(secs):,.1f} | {statistics.median(rates):,.0f} ({spread(rates)}) "
            f"| {padded_rate:,.0f} |"
        )
    ratio = lanes.median_real_per_s() / fifo.median_real_per_s()
    m = meta["machine"]
    lines = [
        f"**lanes / fifo, real tokens/s: {ratio:.2f}x** (ratio of medians; per repetition, lanes and fifo "
        f"run back to back: {', '.join(f'{p:.2f}' for p in paired)}).",
        "",
        *rows,
        "",
        f"- Workload: `{args.trace}`, the first {meta['items']:,} prompts of <= 512 tokens in arrival order "
        f"({meta['real_tokens']:,} tokens, lengths {meta['min_len']}-{meta['max_len']}, median "
        f"{meta['median_len']:.0f}), as a backlog; token ids random word pieces framed by [CLS] ... [SEP].",
        f"- Contract (both policies): budget {args.budget:,} padded tokens, at most {args.max_items} items, "
        f"pad multiple {args.pad}, one batch in flight; lanes with the default `LaneSettings`.",
        f"- {args.reps} repetitions, policies alternating (lanes first on even repetitions); only "
        "`EmbedEngine.run` is timed, after one warm-up batch.",
        f"- Same item, two policies: largest difference of any embedding component "
        f"{meta['max_diff']:.1e} (padding does not change results, only their cost).",
        f"- Machine: {m['nproc']} cores ({m['cpu']}), Python {m['python']}, numpy {m['numpy']}, "
        f"{m['blas']}, threads: {m['blas threads']}. Load average before / after: "
        f"{meta['load_before']} / {meta['load_after']} (the machine is shared).",
        f"- Command: `{meta['command']}` ({meta['wall_s']:.0f} s in all).",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--smoke", action="store_true", help="24 prompts, 3 repetitions, no file written")
    p.add_argument("--trace", default="azure_code", choices=sorted(SHIPPED))
    p.add_argument("--items", type=int, default=1024, help="prompts to take (0 = every one <= 512 tokens)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--budget", type=int, default=4096, help="padded tokens per batch")
    p.add_argument("--max-items", type=int, default=32)
    p.add_argument("--pad", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help=f"markdown file (full run default: {OUT})")
    args = p.parse_args(argv)
    if args.smoke:
        args.items = 24
    if args.out is None and not args.smoke:
        args.out = OUT
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    load_before = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    engine = from_options({})
    records = prompts(args.trace, args.items, engine.model.config.max_positions)
    tokens = token_bytes(records, args.seed)
    contract = Contract(
        consumer="cpu",
        model=MODEL,
        budget_tokens=args.budget,
        max_items=args.max_items,
        pad_multiple=args.pad,
        max_inflight=1,
    )
    results = {p: PolicyResult(form_batches(records, p, contract, tokens)) for p in POLICIES}
    engine.run(results["fifo"].batches[0])  # warm-up: first-touch of the weights, BLAS threads
    for rep in range(args.reps):
        order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
        for name in order:
            run = run_policy(engine, results[name], keep_outputs=rep == 0)
            results[name].runs.append(run)
            rate = f"{run.real_per_s:8,.0f} real tokens/s"
            print(f"rep {rep + 1}/{args.reps} {name:5}: {run.seconds:7.1f} s {rate}", flush=True)
    lanes_out, fifo_out = results["lanes"].outputs, results["fifo"].outputs
    max_diff = max(
        float(np.abs(np.frombuffer(lanes_out[k], "<f4") - np.frombuffer(fifo_out[k], "<f4")).max())
        for k in lanes_out
    )
    lengths = sorted(r.length for r in records)
    env = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ]
    meta = {
        "items": len(records),
        "real_tokens": sum(lengths),
        "min_len": lengths[0],
        "max_len": lengths[-1],
        "median_len": statistics.median(lengths),
        "max_diff": max_diff,
        "machine": machine(),
        "load_before": load_before,
        "load_after": ", ".join(f"{v:.2f}" for v in os.getloadavg()),
        "command": " ".join([*env, ".venv/bin/python", "benchmarks/bench_embed.py", *sys.argv[1:]]),
        "wall_s": time.perf_counter() - started,
    }
    table = render(results, args, meta)
    print()
    print(table)
    if args.out is not None:
        header = (
            "# Embed engine: lanes against FIFO batching on real compute\n\n"
            "Measured by `benchmarks/bench_embed.py` (see its docstring and docs/engine-embed.md). "
            "Every figure below is from one run on the machine described.\n\n"
        )
        args.out.write_text(header + table + "\n", encoding="utf-8")
        print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
