"""The processor against a plain Kafka passthrough (the ceiling), on the same broker, in the same run.

    python benchmarks/bench_pipeline.py                  # 100 / 1,000 / 8,000 tokens, EOS on and off, 3 reps
    python benchmarks/bench_pipeline.py --smoke          # tiny, for CI: counts, not speed
    python benchmarks/bench_pipeline.py --sizes 1000 --modes eos --reps 1 --profile /tmp/p.prof

Why a ceiling: on one broker and one machine, what Python and librdkafka can move from topic to topic
bounds what a processor written with them can. The ratio processor / ceiling, measured side by side,
says how much of that the scheduling costs, and survives a noisy machine better than either number.

* Input: per size, one topic made like ``tokenfabric.ingest`` (6 partitions) with items of one model,
  ``--shapes`` shape signatures, lengths uniform in size x (1 +- 10%), produced once with
  ``TokenProducer`` before any run; every run reads it from the beginning in a fresh consumer group.
* Ceiling (``workers.py ceiling``): consume, produce each message unchanged to a 1-partition topic,
  commit. Same client settings, consume size (5,000), poll timeout and commit cadence (every 500 ms,
  50 ms after output) as the processor; with exactly-once a transaction per commit holding the output
  and ``send_offsets_to_transaction``, and delivery reports for failures only (as the processor's
  transactional producer: the commit is the report), otherwise plain produces and synchronous offset
  commits.
* Processor (``workers.py processor``): ``ProcessorService`` with default settings and fresh topics for
  everything but its input; one drainer (``workers.py drainer``, its own process) announces a generous
  contract and completes every item the moment its batch arrives, with one ``CompletionBatch``
  message per batch, as consumer apps do by default. The drainer runs on the same two cores; its CPU
  per item is reported beside the processor's, as is the processor's loop thread alone (its Python
  work, without librdkafka's threads).
* Each side runs in its own process and is timed the same way: from the start of the consume call
  that returned the first input message to the moment the last output was durable (the commit of the
  transaction that holds it, or its delivery report). Runs alternate ceiling, processor, ``--reps``
  times per size and mode; tables give the median and the range.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BrokerCpu,
    Produced,
    RunTopics,
    Spread,
    TopicSpec,
    Worker,
    delete_topics,
    input_spec,
    load_average,
    make_topics,
    produce_items,
    run_specs,
    unique,
    write_json,
)

from processor.kafka.topics import RETAINED

MODEL = "bench-model"
DRAINER = "drain"
FULL_ITEMS = {100: 300_000, 1000: 150_000, 8000: 20_000}
SMOKE_ITEMS = {100: 1_500, 1000: 600}
MODES = {"eos": True, "alo": False}
DRAIN_INFLIGHT = 256
JITTER = 0.1


@dataclass(frozen=True, slots=True)
class DrainContract:
    """What the drainer announces: big enough that the processor, not the consumer, is the limit."""

    budget_tokens: int = 262_144
    max_items: int = 256
    pad_multiple: int = 8
    max_inflight: int = DRAIN_INFLIGHT

    def as_contract(self) -> dict[str, Any]:
        return {"consumer": DRAINER, "model": MODEL, **asdict(self)}


def run_ceiling(
    conf: dict[str, str], source: Produced, eos: bool, timeout_s: float, broker: BrokerCpu | None = None
) -> dict[str, Any]:
    base = unique("bench-ceil")
    out = f"{base}.out"
    make_topics(conf, [TopicSpec(out, 1, RETAINED)])
    args = {
        "bootstrap": conf["bootstrap.servers"],
        "source": source.topic,
        "out": out,
        "group": f"{base}-group",
        "transactional_id": f"{base}-txn",
        "exactly_once": eos,
        "expected": source.items,
        "timeout_s": timeout_s,
    }
    worker = Worker("ceiling", args | {"broker_pid": broker.pid if broker else None})
    try:
        result = worker.result(timeout_s + 60)
    finally:
        worker.stop()
        delete_topics(conf, [out])
    if result["items"] != source.items:
        raise RuntimeError(f"ceiling passed {result['items']:,} of {source.items:,} messages")
    result["tokens"] = source.tokens
    return result


def run_processor(
    conf: dict[str, str],
    source: Produced,
    eos: bool,
    contract: DrainContract,
    timeout_s: float,
    profile: str | None = None,
    broker: BrokerCpu | None = None,
) -> dict[str, Any]:
    prefix = unique("bench-proc")
    topics = RunTopics(prefix, source=source.topic)
    names = make_topics(conf, run_specs(topics, [DRAINER]))
    common = {
        "bootstrap": conf["bootstrap.servers"],
        "prefix": prefix,
        "source": source.topic,
        "expected": source.items,
        "timeout_s": timeout_s,
    }
    started: list[Worker] = []
    try:
        drainer = Worker("drainer", common | {"contract": contract.as_contract()})
        started.append(drainer)
        drainer.wait_ready()
        args = {
            "instance": f"{prefix}-p",
            "group": f"{prefix}-group",
            "exactly_once": eos,
            "profile": profile,
            "broker_pid": broker.pid if broker else None,
        }
        started.append(worker := Worker("processor", common | args))
        result = worker.result(timeout_s + 60)
        result["drainer"] = drainer.result(120)
    finally:
        for w in started:
            w.stop()
        delete_topics(conf, names)
    check_processor(result, source)
    return result


def check_processor(result: dict[str, Any], source: Produced) -> None:
    """The run counts only if every item went out once, in batches that kept the contract."""
    drained = result["drainer"]
    problems = []
    if (result["items"], result["consumed"], result["tokens"]) != (source.items, source.items, source.tokens):
        problems.append(
            f"processor routed {result['items']:,} items / {result['tokens']:,} tokens, "
            f"consumed {result['consumed']:,}; produced {source.items:,} / {source.tokens:,}"
        )
    if (drained["distinct"], drained["items"], drained["violations"]) != (source.items, source.items, 0):
        problems.append(
            f"drainer saw {drained['items']:,} items ({drained['distinct']:,} distinct), "
            f"{drained['violations']} contract violations"
        )
    if problems:
        raise RuntimeError("; ".join(problems))


def rates(run: dict[str, Any]) -> dict[str, float]:
    return {
        "items_per_s": run["items"] / run["seconds"],
        "tokens_per_s": run["tokens"] / run["seconds"],
        "cpu_us_per_item": run["cpu_s"] / run["items"] * 1e6,
        "thread_us_per_item": run["thread_cpu_s"] / run["items"] * 1e6,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range per figure; ratios are taken per repetition (each pair ran back to back)."""
    ceiling = [rates(r["ceiling"]) for r in runs]
    proc = [rates(r["processor"]) for r in runs]
    pairs = list(zip(proc, ceiling, strict=True))

    def spread(values: list[float]) -> dict[str, float]:
        return asdict(Spread.of(values))

    processed = [r["processor"] for r in runs]
    return {
        "ceiling_items_per_s": spread([c["items_per_s"] for c in ceiling]),
        "processor_items_per_s": spread([p["items_per_s"] for p in proc]),
        "processor_tokens_per_s": spread([p["tokens_per_s"] for p in proc]),
        "ratio": spread([p["items_per_s"] / c["items_per_s"] for p, c in pairs]),
        "ceiling_cpu_us_per_item": spread([c["cpu_us_per_item"] for c in ceiling]),
        "processor_cpu_us_per_item": spread([p["cpu_us_per_item"] for p in proc]),
        "cpu_ratio": spread([c["cpu_us_per_item"] / p["cpu_us_per_item"] for p, c in pairs]),
        "processor_thread_us_per_item": spread([p["thread_us_per_item"] for p in proc]),
        "drainer_cpu_us_per_item": spread([r["drainer"]["cpu_s"] / r["items"] * 1e6 for r in processed]),
        "batch_items": sum(r["items"] for r in processed) / sum(r["batches"] for r in processed),
        "completions_in_span": min(r["completions_in_span"] / r["items"] for r in processed),
        **broker_cpu(runs),
    }


def broker_cpu(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The broker's CPU per item over each side's measured interval, and the whole machine's: the
    side's processes plus the broker. Absent when the broker is not local."""
    if any(r[side].get("broker_cpu_s") is None for r in runs for side in ("ceiling", "processor")):
        return {}

    def per_item(values: list[float], items: list[int]) -> dict[str, float]:
        return asdict(Spread.of([v / n * 1e6 for v, n in zip(values, items, strict=True)]))

    ceiling, proc = [r["ceiling"] for r in runs], [r["processor"] for r in runs]
    return {
        "ceiling_broker_us_per_item": per_item(
            [r["broker_cpu_s"] for r in ceiling], [r["items"] for r in ceiling]
        ),
        "processor_broker_us_per_item": per_item(
            [r["broker_cpu_s"] for r in proc], [r["items"] for r in proc]
        ),
        "ceiling_machine_us_per_item": asdict(Spread.of(_machine(runs, "ceiling"))),
        "processor_machine_us_per_item": asdict(Spread.of(_machine(runs, "processor"))),
    }


def bench(
    conf: dict[str, str],
    sizes: dict[int, int],
    modes: list[str],
    reps: int,
    shapes: int,
    jitter: float,
    contract: DrainContract,
    timeout_s: float,
    profile: str | None = None,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Every size: produce its input once, then per mode ``reps`` x (ceiling, processor)."""
    out = []
    broker = BrokerCpu.find(conf["bootstrap.servers"])
    for tokens, items in sizes.items():
        topic = f"{unique('bench-in')}-{tokens}"
        make_topics(conf, [input_spec(topic)])
        try:
            source = produce_items(
                conf, topic, items=items, tokens=tokens, model=MODEL, shapes=shapes, jitter=jitter
            )
            log(f"{tokens:,} tokens: produced {items:,} items in {source.seconds:.1f} s (not measured)")
            entry: dict[str, Any] = {
                "tokens": tokens,
                "items": items,
                "input_tokens": source.tokens,
                "modes": {},
            }
            for mode in modes:
                runs = []
                for rep in range(reps):
                    ceiling = run_ceiling(conf, source, MODES[mode], timeout_s, broker)
                    proc = run_processor(conf, source, MODES[mode], contract, timeout_s, profile, broker)
                    runs.append({"ceiling": ceiling, "processor": proc, "load": load_average()})
                    log(describe_rep(mode, rep, ceiling, proc))
                entry["modes"][mode] = {"runs": runs, "summary": summarise(runs)}
            out.append(entry)
        finally:
            delete_topics(conf, [topic])
    return out


def describe_rep(mode: str, rep: int, ceiling: dict[str, Any], proc: dict[str, Any]) -> str:
    c, p = rates(ceiling), rates(proc)
    return (
        f"  {mode} rep {rep + 1}: ceiling {c['items_per_s']:,.0f} items/s, processor {p['items_per_s']:,.0f} "
        f"items/s, ratio {p['items_per_s'] / c['items_per_s']:.2f}; CPU us/item {c['cpu_us_per_item']:.0f} / "
        f"{p['cpu_us_per_item']:.0f} (loop thread {p['thread_us_per_item']:.0f}, drainer "
        f"{proc['drainer']['cpu_s'] / proc['items'] * 1e6:.0f}); "
        f"{proc['items'] / proc['batches']:.0f} items/batch, "
        f"{proc['completions_in_span'] / proc['items']:.0%} completed within the span"
        + (
            f"; broker CPU us/item {ceiling['broker_cpu_s'] / ceiling['items'] * 1e6:.0f} / "
            f"{proc['broker_cpu_s'] / proc['items'] * 1e6:.0f}"
            if proc.get("broker_cpu_s") is not None and ceiling.get("broker_cpu_s") is not None
            else ""
        )
    )


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per size and mode, median (min-max) over the repetitions."""
    lines = [
        "| tokens/item | exactly-once | items | ceiling items/s | processor items/s | processor Mtokens/s "
        "| **processor / ceiling** | CPU us/item ceiling | CPU us/item processor | CPU ratio "
        "| processor loop thread us/item | drainer CPU us/item | items/batch |",
        "| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for entry in results:
        for mode, data in entry["modes"].items():
            s = {k: Spread(**v) for k, v in data["summary"].items() if isinstance(v, dict)}
            lines.append(
                f"| {entry['tokens']:,} | {'on' if mode == 'eos' else 'off'} | {entry['items']:,} "
                f"| {s['ceiling_items_per_s'].fmt()} | {s['processor_items_per_s'].fmt()} "
                f"| {s['processor_tokens_per_s'].fmt('.1f', 1e6)} | **{s['ratio'].fmt('.2f')}** "
                f"| {s['ceiling_cpu_us_per_item'].fmt('.1f')} | {s['processor_cpu_us_per_item'].fmt('.1f')} "
                f"| {s['cpu_ratio'].fmt('.2f')} | {s['processor_thread_us_per_item'].fmt('.1f')} "
                f"| {s['drainer_cpu_us_per_item'].fmt('.1f')} | {data['summary']['batch_items']:.0f} |"
            )
    return "\n".join(lines)


def cpu_table(results: list[dict[str, Any]]) -> str | None:
    """Markdown: where each side's CPU went, per item, with the broker's; None without broker figures."""
    rows = []
    for entry in results:
        for mode, data in entry["modes"].items():
            summary = data["summary"]
            if "processor_machine_us_per_item" not in summary:
                return None
            s = {k: Spread(**v) for k, v in summary.items() if isinstance(v, dict)}
            machine = [
                c / p
                for c, p in zip(
                    _machine(data["runs"], "ceiling"), _machine(data["runs"], "processor"), strict=True
                )
            ]
            rows.append(
                f"| {entry['tokens']:,} | {'on' if mode == 'eos' else 'off'} "
                f"| {s['ceiling_cpu_us_per_item'].fmt('.1f')} | {s['ceiling_broker_us_per_item'].fmt('.1f')} "
                f"| **{s['ceiling_machine_us_per_item'].fmt('.1f')}** "
                f"| {s['processor_cpu_us_per_item'].fmt('.1f')} | {s['drainer_cpu_us_per_item'].fmt('.1f')} "
                f"| {s['processor_broker_us_per_item'].fmt('.1f')} "
                f"| **{s['processor_machine_us_per_item'].fmt('.1f')}** "
                f"| **{Spread.of(machine).fmt('.2f')}** | {s['ratio'].fmt('.2f')} |"
            )
    head = [
        "| tokens/item | exactly-once | ceiling process | broker | **machine, ceiling side** "
        "| processor process | drainer | broker | **machine, processor side** "
        "| **machine CPU ratio** (ceiling / processor side) | processor / ceiling, items/s |",
        "| ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join(head + rows)


def _machine(runs: list[dict[str, Any]], side: str) -> list[float]:
    """CPU us per item of everything one side kept busy: its processes and the broker."""
    out = []
    for run in runs:
        r = run[side]
        cpu_s = r["cpu_s"] + r["broker_cpu_s"] + (r["drainer"]["cpu_s"] if side == "processor" else 0.0)
        out.append(cpu_s / r["items"] * 1e6)
    return out


def parse_sizes(text: str | None, defaults: dict[int, int]) -> dict[int, int]:
    """``100,1000`` (default item counts) or ``100=5000,1000=2000``."""
    if not text:
        return dict(defaults)
    out = {}
    for part in text.split(","):
        size, _, count = part.partition("=")
        out[int(size)] = int(count) if count else FULL_ITEMS.get(int(size), 10_000)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", help="host:port (default: $KAFKA_BOOTSTRAP or the local broker)")
    p.add_argument("--smoke", action="store_true", help=f"sizes {SMOKE_ITEMS}, one repetition")
    p.add_argument("--sizes", help=f"tokens[=items],... (default {FULL_ITEMS})")
    p.add_argument("--modes", default="eos,alo", help="eos, alo or both (default: eos,alo)")
    p.add_argument("--reps", type=int, help="repetitions per size and mode (default 3; smoke 1)")
    p.add_argument("--shapes", type=int, default=8, help="shape signatures in the input (default 8)")
    p.add_argument("--jitter", type=float, default=JITTER, help="item lengths: size x (1 +- jitter)")
    p.add_argument("--inflight", type=int, default=DRAIN_INFLIGHT, help="drainer max_inflight")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one side may take")
    p.add_argument("--profile", help="cProfile the processor's loop into this file (every processor run)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    from processor.kafka.config import client_config
    from processor.local.broker import local_bootstrap

    conf = client_config(args.bootstrap, fallback=local_bootstrap)
    sizes = parse_sizes(args.sizes, SMOKE_ITEMS if args.smoke else FULL_ITEMS)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - MODES.keys():
        p.error(f"unknown modes {sorted(unknown)}")
    reps = args.reps or (1 if args.smoke else 3)
    contract = DrainContract(max_inflight=args.inflight)
    results = bench(conf, sizes, modes, reps, args.shapes, args.jitter, contract, args.timeout, args.profile)
    print()
    print(table(results))
    if (cpu := cpu_table(results)) is not None:
        print()
        print(cpu)
    write_json(
        args.json, {"contract": contract.as_contract(), "shapes": args.shapes, "reps": reps, "sizes": results}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
