"""``tokenfabric demo``: the main job. One backlog through tokenfabric and through a plain Kafka queue.

Two runs on the same broker, with the same items and the same two cards (a small and a large contract,
``local.pipeline.MAIN_CARDS``):

* **tokenfabric**: a producer, the processor (lanes, shape-sticky dispatch) and one consumer app per
  card, each as its own process, as in production;
* **plain-queue**: the baseline teams run without tokenfabric (processor.apps.plainqueue): the cards
  form one consumer group on the ingest topic and each packs what it reads, in arrival order, to the
  same contract.

Both run the embed engine (all-MiniLM-L6-v2, for real, on the CPU) by default; ``--engine sim`` is a
quick modelled run. The report is computed by reading each run's topics back (processor.local.compare)
and printed side by side with the ratio; ``--json`` writes it for scripts (docs/demo.md has the keys),
``--plot`` charts it. Exit status: 0 when both runs completed every item once with a clean audit, 1
otherwise, 2 for bad arguments or an unreadable trace.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.demo_phases import PhaseLine, drain, wait_ready
from processor.cli.demo_repeats import headline, median_repeat, run_dict, run_order
from processor.cli.demo_report import LLM_RUNS, RUNS
from processor.cli.demo_report import report as render_report
from processor.cli.options import check_plot
from processor.local.pipeline import (
    DEFAULT_CARDS,
    LLM_CARDS,
    MAIN_CARDS,
    Card,
    child_env,
    log_dir,
    unique_prefix,
)
from processor.sim.traces import SHIPPED, TraceError, TraceRecord, read_trace, shipped_trace

if TYPE_CHECKING:  # Kafka loads only when the command runs
    from processor.kafka.topics import TopicNames
    from processor.local.card_servers import CardServers, GivenEndpoints
    from processor.local.compare import ResultsWatcher, RunFigures
    from processor.local.pipeline import Pipeline

#: The default item count: both runs' drains fit in about two minutes on the 2-core machine (README).
DEFAULT_ITEMS = 500
#: ``--engine llm``'s default: three runs of the ``prod`` model, repeated 3 times, fit 15 minutes on the
#: 2-core machine (docs/demo.md).
LLM_DEFAULT_ITEMS = 300
#: Longest item the embed engine takes (MiniLM's positions).
EMBED_MAX_TOKENS = 512
ENGINES = ("embed", "llm", "sim")
#: ``--engine llm``: slots per llama-server (4,096 positions each). Each item asks for its trace's output
#: length (processor/sim/generative.py, ``output_budget``), held to it with ``ignore_eos``.
LLM_SLOTS = 4
#: Each run's topic prefix ends with its tag.
_TOPIC_TAGS = {"tokenfabric": "tf", "plain-queue": "pq", "share-queue": "sq"}
#: The processor's lane settings for cards that pad to 1 token: padding is measured in single tokens and
#: an item shares a lane that pads it by at most one token (``simulate --trace templated --policy lanes``
#: with these flags: 250 batches for 1,000 items, 0.29% waste; the defaults give 368 batches, 0.01%).
EXACT_LANES = ["--lane-pad-multiple", "1", "--floor-tokens", "1", "--cap-tokens", "1"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        default="templated",
        help=f"a shipped trace ({', '.join(SHIPPED)}) or a file path (default: templated, the templated "
        "backlog of data/templates)",
    )
    p.add_argument("--format", default=None, help="format of a trace file (shipped traces know theirs)")
    p.add_argument(
        "--shape-blocks", type=int, default=1, help="mooncake: hash ids that make a shape (default: 1)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"items (default: {DEFAULT_ITEMS}, {LLM_DEFAULT_ITEMS} for --engine llm; 0 = all)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each pipeline N times, alternating the order; medians and ranges (default: 1)",
    )
    p.add_argument(
        "--llm-model",
        default="prod",
        choices=("prod", "small"),
        help="--engine llm: the random-weight model's shape (prod: 8 layers, 256 wide, the default; "
        "small: 2 layers, 128 wide, the first one; docs/demo.md)",
    )
    p.add_argument(
        "--llm-slot-affinity",
        default="tokenfabric",
        choices=("tokenfabric", "all", "off"),
        help="--engine llm: which runs send each shape's items to one llama-server slot (id_slot): "
        "tokenfabric's (the default; the baselines' mixed batches do better with the server's own "
        "choice, docs/demo.md), all runs', or none",
    )
    p.add_argument(
        "--engine",
        default="embed",
        choices=ENGINES,
        help="embed: MiniLM for real on the CPU (default); llm: the generative backlog on local "
        "llama-servers, prefix caches measured (the first run builds llama-server, about 14 min); "
        "sim: the modelled cards, quick",
    )
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="URL",
        help="--engine llm: an OpenAI-compatible server to use instead of a local llama-server, one per "
        "card in order (vLLM, SGLang: docs/engine-openai.md); the runs' token ids are salted apart",
    )
    p.add_argument("--endpoint-model", default=None, help="--endpoint: the model name the servers serve")
    p.add_argument(
        "--llm-slots",
        type=int,
        default=LLM_SLOTS,
        help=f"--engine llm: each server's slots, its concurrent sequences (default: {LLM_SLOTS})",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        help="--engine sim: fraction of the modelled engine time slept (default: 0.5)",
    )
    p.add_argument(
        "--timeout-s", type=float, default=600, help="give up a run after this long (default: %(default)s)"
    )
    p.add_argument("--bootstrap", help="use this cluster instead of starting a local broker")
    p.add_argument(
        "--plot",
        default="tokenfabric-demo.png",
        metavar="FILE.png",
        help="chart of the two measured runs (default: tokenfabric-demo.png; '' for none)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON (docs/demo.md)")


def _load(args: argparse.Namespace) -> tuple[list[TraceRecord], str]:
    if args.limit is None:
        args.limit = LLM_DEFAULT_ITEMS if args.engine == "llm" else DEFAULT_ITEMS
    if not 1 <= args.repeat <= 20:
        raise ValueError(f"--repeat must be 1 to 20, got {args.repeat}")
    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0, got {args.limit}")
    if not args.time_scale >= 0:
        raise ValueError(f"--time-scale must be >= 0, got {args.time_scale}")
    if args.engine == "llm":
        return _generative(args)
    if args.endpoint or args.endpoint_model:
        raise ValueError("--endpoint and --endpoint-model apply to --engine llm only")
    if args.trace in SHIPPED:
        path, fmt = shipped_trace(args.trace), SHIPPED[args.trace][1]
    else:
        path, fmt = Path(args.trace), args.format or "jsonl"
    records = read_trace(path, fmt, shape_blocks=args.shape_blocks, limit=args.limit or None)
    if not records:
        raise ValueError(f"{path}: no items to replay")
    longest = max(r.length for r in records)
    if args.engine == "embed" and longest > EMBED_MAX_TOKENS:
        raise ValueError(
            f"{path.name}: items of up to {longest:,} tokens; the embed engine takes at most "
            f"{EMBED_MAX_TOKENS} (use --engine sim, or a trace such as templated)"
        )
    return records, args.trace if args.trace in SHIPPED else path.name


def _generative(args: argparse.Namespace) -> tuple[list[TraceRecord], str]:
    """``--engine llm``'s backlog: the generative one (processor/sim/generative.py), no other."""
    from processor.sim.generative import generative_rows

    if args.trace != "templated" or args.format is not None:
        raise ValueError(
            "--engine llm runs the generative backlog (docs/demo.md); leave out --trace and --format"
        )
    if args.endpoint and len(args.endpoint) != len(LLM_CARDS):
        raise ValueError(
            f"--endpoint: give one per card ({len(LLM_CARDS)}: {', '.join(c.name for c in LLM_CARDS)})"
        )
    if not 1 <= args.llm_slots <= 16:
        raise ValueError(f"--llm-slots must be 1 to 16, got {args.llm_slots}")
    return [row.record for row in generative_rows(args.limit or None)], "generative"


def cards_for(records: list[TraceRecord], engine: str = "embed") -> tuple[Card, ...]:
    """The generation servers' cards, the main job's cards, or the 16k/32k modelled cards for a trace
    of longer prompts."""
    if engine == "llm":
        return LLM_CARDS
    if max(r.length for r in records) <= EMBED_MAX_TOKENS:
        return MAIN_CARDS
    return DEFAULT_CARDS


def run(args: argparse.Namespace) -> int:
    try:
        records, trace_name = _load(args)
        if args.plot:
            check_plot(args.plot, need_matplotlib=False)  # without it the report stands alone
    except (TraceError, ValueError) as exc:
        print(f"tokenfabric demo: error: {exc}", file=sys.stderr)
        return 2
    line = PhaseLine()
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    state = None
    started = time.monotonic()
    if not bootstrap:
        from processor.local.broker import start_broker

        state = log_dir() / "kafka"
        line.done("setup: starting a local Kafka broker (the first run downloads its jars with Maven)...")
        bootstrap = start_broker(state, heap_mb=512).bootstrap
    try:
        return _main_job(args, line, records, trace_name, bootstrap, started)
    finally:
        if state is not None:
            from processor.local.broker import stop_broker

            stop_broker(state)


def _main_job(
    args: argparse.Namespace,
    line: PhaseLine,
    records: list[TraceRecord],
    trace_name: str,
    bootstrap: str,
    started: float,
) -> int:
    from processor.kafka.config import client_config

    conf = client_config(bootstrap)
    cards = cards_for(records, args.engine)
    line.done(
        f"setup: broker {bootstrap} ready in {time.monotonic() - started:.0f} s; {len(records):,} items "
        f"from {trace_name}, cards {', '.join(f'{c.name} ({c.budget:,}/{c.items}/{c.pad})' for c in cards)}, "
        f"engine {args.engine}"
    )
    payloads = _payloads(records, args.engine, line)
    logs = log_dir()
    runs = LLM_RUNS if args.engine == "llm" else RUNS
    repeats: dict[str, list[RunFigures]] = {name: [] for name in runs}
    codes: dict[str, dict[str, int | None]] = {}
    for r in range(args.repeat):
        for name in run_order(runs, r):
            if args.repeat > 1:
                line.done(f"repeat {r + 1} of {args.repeat}: {name}")
            f, codes[name] = _one_run(name, args, conf, bootstrap, records, payloads, cards, logs, line)
            repeats[name].append(f)
            if any(c != 0 for c in codes[name].values()):
                line.done(f"{name}: a card exited {codes[name]}")
    if args.engine == "llm":
        from processor.sim.generative import cacheable_tokens, generative_rows

        cacheable = cacheable_tokens(generative_rows(len(records)))
        for f in (f for reps in repeats.values() for f in reps):
            f.prefix_tokens = cacheable
    figures = {name: median_repeat(reps) for name, reps in repeats.items()}
    width = shutil.get_terminal_size((100, 24)).columns
    print(render_report(trace_name, records, figures, codes, args.engine, cards, width))
    print(headline(repeats))
    print(f"logs in {logs}; total {time.monotonic() - started:.0f} s")
    if args.json:
        doc = {
            "trace": trace_name,
            "cards": {c.name: {"budget": c.budget, "items": c.items, "pad": c.pad} for c in cards},
            "repeat": args.repeat,
            "runs": {name: run_dict(reps, audits=name != "share-queue") for name, reps in repeats.items()},
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"report as JSON: {args.json}")
    if args.plot:
        _plot_measured(figures, trace_name, args.plot)
    every = [f for reps in repeats.values() for f in reps]
    ok = all(f.audit_clean and f.items_completed_once == f.items == len(records) for f in every)
    return 0 if ok and all(c == 0 for run_codes in codes.values() for c in run_codes.values()) else 1


def _payloads(records: list[TraceRecord], engine: str, line: PhaseLine, salt: int = 0) -> list[bytes]:
    """Token ids per item: MiniLM word pieces for the embed engine, the generative backlog's (rows of a
    template share its prefix ids) for llm, the producer's synthetic ids else."""
    from processor.apps.producer import synthetic_tokens
    from processor.sim.generative import generative_rows, generative_tokens
    from processor.sim.templated import wordpiece_tokens

    if engine == "llm":
        out = [generative_tokens(row, salt) for row in generative_rows(len(records))]
        line.done(f"setup: {len(out):,} prompts tokenised ({sum(r.length for r in records):,} tokens)")
        return out
    make = wordpiece_tokens if engine == "embed" else synthetic_tokens
    out = [make(r.id, r.length) for r in records]
    line.done(f"setup: {len(out):,} prompts tokenised ({sum(r.length for r in records):,} tokens)")
    return out


def _one_run(
    name: str,
    args: argparse.Namespace,
    conf: dict[str, str],
    bootstrap: str,
    records: list[TraceRecord],
    payloads: list[bytes],
    cards: tuple[Card, ...],
    logs: Path,
    line: PhaseLine,
) -> tuple[RunFigures, dict[str, int | None]]:
    from processor.kafka.topics import TopicNames, create_topics, topic_specs
    from processor.local.card_servers import CardServers, GivenEndpoints
    from processor.local.pipeline import Pipeline

    topics = TopicNames(f"{unique_prefix()}-{_TOPIC_TAGS[name]}")
    create_topics(conf, topic_specs(topics, consumers=[c.name for c in cards]))
    env = child_env(bootstrap)
    env["OPENBLAS_NUM_THREADS"] = "1"  # one core per card: the cards run side by side
    (logs / name).mkdir(exist_ok=True)
    pipeline = Pipeline(logs / name)
    model = records[0].model
    servers: CardServers | GivenEndpoints | None = None
    if args.engine == "llm" and args.endpoint:
        servers = GivenEndpoints(cards, args.endpoint, args.endpoint_model)
        payloads = _payloads(records, args.engine, line, salt=LLM_RUNS.index(name) + 1)
    elif args.engine == "llm":
        affinity = args.llm_slot_affinity == "all" or args.llm_slot_affinity == name
        servers = CardServers(name, cards, args.llm_slots, line.done, args.llm_model, affinity)
    if servers is not None:
        servers.start()
    try:
        return _run_pipeline(
            name, args, conf, topics, records, payloads, cards, pipeline, line, servers, model, env
        )
    finally:
        if servers is not None:
            servers.stop()


def _run_pipeline(
    name: str,
    args: argparse.Namespace,
    conf: dict[str, str],
    topics: TopicNames,
    records: list[TraceRecord],
    payloads: list[bytes],
    cards: tuple[Card, ...],
    pipeline: Pipeline,
    line: PhaseLine,
    servers: CardServers | GivenEndpoints | None,
    model: str,
    env: dict[str, str],
) -> tuple[RunFigures, dict[str, int | None]]:
    from processor.apps.plainqueue import plain_group
    from processor.apps.producer import TokenProducer
    from processor.local.compare import ResultsWatcher, measure
    from processor.local.pipeline import group_members
    from processor.sim.generative import output_budget

    prefix = ["--topic-prefix", topics.prefix]
    quiet = ["--metrics-port", "0"]
    tf = name == "tokenfabric"

    def engine(card: Card) -> list[str]:
        if servers is None:
            return card.engine_args(args.engine, args.time_scale)
        return servers.engine_args(card)

    if tf:
        lanes = EXACT_LANES if all(c.pad == 1 for c in cards) else []
        pipeline.spawn("processor", ["processor", *prefix, *quiet, *lanes], env)
        for card in cards:
            card_args = [*card.contract_args(model), "--inflight", str(card.inflight), *engine(card)]
            pipeline.spawn(card.name, ["consumer", *prefix, *quiet, *card_args], env)
    else:
        for card in cards:
            pipeline.spawn(card.name, [name, *prefix, *card.contract_args(model), *engine(card)], env)
    budget = (lambda r: output_budget(r.output_length)) if servers else (lambda r: r.output_length)
    watcher: ResultsWatcher | None = None
    try:
        group = topics.processor_group if tf else plain_group(topics)
        wait_ready(name, conf, topics, cards, group, pipeline, line, group_members)
        key_of = None if tf else (lambda rec: rec.item_id.encode("utf-8"))
        t0 = time.monotonic()
        with TokenProducer(conf, topics, key_of=key_of) as producer:
            for i, (r, tokens) in enumerate(zip(records, payloads, strict=True)):
                producer.send(r.id, r.model, tokens, shape=r.shape, output_budget=budget(r))
                if i % 100 == 0:
                    line.update(f"{name}: produce {i:,}/{len(records):,} items")
        line.done(f"{name}: produced {len(records):,} items in {time.monotonic() - t0:.1f} s")
        watcher = ResultsWatcher(conf, topics.results)
        drain(name, watcher, len(records), pipeline, args.timeout_s, line)
        if tf:
            from processor.local.pipeline import wait_until_done

            wait_until_done(conf, topics, len(records), pipeline, 60)  # the ledger has caught up
    finally:
        if watcher is not None:
            watcher.close()
        codes = pipeline.stop()
    figures = measure(conf, topics, {c.name: c.budget for c in cards}, args.engine)
    figures.audit_clean = _audit(conf, topics, figures, tf)
    return figures, codes


def _audit(conf: dict[str, str], topics: TopicNames, f: RunFigures, tf: bool) -> bool:
    """tokenfabric: ``tokenfabric audit`` (topics against the processor's ledger) and the read-back; the
    queues have no ledger, so their audit is the read-back: every item completed once, none lost."""
    from processor.kafka.reader import read_topic
    from processor.ops.audit import audit

    readback = (
        f.items_completed_once == f.items
        and f.duplicate_completions == 0
        and f.lost_items == 0
        and not any(True for _ in read_topic(conf, topics.dead_letter))
    )
    if not tf:
        return readback
    return readback and audit(conf, topics).clean


def _plot_measured(figures: Mapping[str, RunFigures], trace_name: str, path: str) -> None:
    try:
        from processor.sim.plots import plot_measured

        plot_measured({n: f.to_dict() for n, f in figures.items()}, path, f"{trace_name}: measured")
    except ValueError as exc:  # matplotlib missing: the report above stands on its own
        print(f"no chart: {exc}", file=sys.stderr)
        return
    print(f"chart of the two measured runs: {path}")
