"""``tokenfabric produce``: replay a trace onto the ingest topic, with synthetic tokens.

Each trace record becomes one TokenItem: the record's model, shape and length, ``output_length`` as
the output budget, and :func:`processor.apps.producer.synthetic_tokens` as the prompt. Item ids are
``<job>:<trace id>`` so two replays of one trace never collide; ``--job`` names the job (default:
the trace's name plus a time stamp), and the summary line prints it.

Pacing: by default every item is sent as fast as the producer allows (an offline backlog, same as
``--backlog``); ``--speed X`` keeps the trace's inter-arrival times, X times faster.

Exit status: 0 when every item was acknowledged; 2 for bad arguments, an unreadable trace, bad Kafka
settings or a missing ingest topic; 1 when Kafka fails at run time; 130 when interrupted (what was
queued is flushed first).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.options import add_kafka_arguments, add_trace_reading_arguments, kafka_settings
from processor.sim.traces import FORMATS, SHIPPED

if TYPE_CHECKING:  # Kafka loads only when the command runs
    from rich.progress import Progress

    from processor.apps.producer import TokenProducer
    from processor.sim.traces import TraceRecord

PROG = "tokenfabric produce"
_PROGRESS_EVERY_S = 0.1


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace", required=True, help=f"trace file (.gz accepted), or a shipped trace: {', '.join(SHIPPED)}"
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="trace format (default: jsonl, or the shipped trace's own)",
    )
    add_trace_reading_arguments(p)
    pace = p.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed", type=float, default=None, help="keep the trace's arrival times, X times faster"
    )
    pace.add_argument("--backlog", action="store_true", help="send everything at once (the default)")
    p.add_argument(
        "--tokens",
        default="synthetic",
        choices=("synthetic", "wordpiece"),
        help="token ids: synthetic (17-bit, the default) or wordpiece (MiniLM's vocabulary, for --engine "
        "embed consumers: [CLS], stand-in word pieces, [SEP])",
    )
    p.add_argument("--job", default=None, help="job id of every item (default: <trace>-<time>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_kafka_arguments(p)


def _trace_path(args: argparse.Namespace) -> tuple[Path, str]:
    path = Path(args.trace)
    if not path.exists() and args.trace in SHIPPED:
        from processor.sim.traces import shipped_trace

        return shipped_trace(args.trace), args.format or SHIPPED[args.trace][1]
    return path, args.format or "jsonl"


def _default_job(path: Path) -> str:
    stem = path.name.split(".")[0] or "trace"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.apps.producer import MissingTopicError, ProduceError, TokenProducer
    from processor.kafka.config import ConfigError
    from processor.sim.traces import TraceError, read_trace

    try:
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        if args.shape_blocks < 0:
            raise ValueError(f"--shape-blocks must be >= 0, got {args.shape_blocks}")
        if args.speed is not None and not args.speed > 0:
            raise ValueError(f"--speed must be > 0, got {args.speed}")
        path, fmt = _trace_path(args)
        records = read_trace(
            path, fmt, shape_blocks=args.shape_blocks, default_model=args.model, limit=args.limit
        )
        conf, topics = kafka_settings(args, pipeline=True)  # local mistakes first, then the network
    except (TraceError, ConfigError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    job = args.job if args.job is not None else _default_job(path)
    started = time.perf_counter()
    interrupted = False
    try:
        producer = TokenProducer(conf, topics)
        producer.check_topic()
        try:
            _replay(
                producer, records, job, args.speed, show_progress=not args.no_progress, tokens=args.tokens
            )
        except KeyboardInterrupt:
            interrupted = True
            producer.close(timeout=120.0)
    except MissingTopicError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (KafkaException, ProduceError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    rate = producer.sent_tokens / seconds if seconds > 0 else 0.0
    prefix = "interrupted: " if interrupted else ""
    print(
        f"{prefix}produced {producer.sent} items, {producer.sent_tokens} tokens in {seconds:.2f} s "
        f"({rate:,.0f} tokens/s) to {topics.ingest}, job {job}"
    )
    return 130 if interrupted else 0


def _replay(
    producer: TokenProducer,
    records: list[TraceRecord],
    job: str,
    speed: float | None,
    *,
    show_progress: bool,
    tokens: str = "synthetic",
) -> None:
    from rich.progress import TaskID

    from processor.apps.producer import synthetic_tokens
    from processor.sim.templated import wordpiece_tokens

    make_tokens = wordpiece_tokens if tokens == "wordpiece" else synthetic_tokens
    progress = _progress_bar(show_progress)
    t0_trace = records[0].t_ms if records else 0
    t0_wall = time.monotonic()
    last_update = 0.0

    def show(task: TaskID, n: int) -> None:
        elapsed = time.monotonic() - t0_wall
        rate = producer.sent_tokens / elapsed if elapsed > 0 else 0.0
        progress.update(task, completed=n, rate=f"{rate:,.0f} tokens/s")

    with progress:
        task = progress.add_task("produce", total=len(records), rate="")
        for n, rec in enumerate(records, start=1):
            if speed is not None:
                _wait_until(producer, t0_wall + (rec.t_ms - t0_trace) / 1000.0 / speed)
            item_id = f"{job}:{rec.id}"
            producer.send(
                item_id,
                rec.model,
                make_tokens(item_id, rec.length),
                shape=rec.shape,
                job_id=job,
                output_budget=rec.output_length,
            )
            now = time.monotonic()
            if now - last_update >= _PROGRESS_EVERY_S:
                last_update = now
                show(task, n)
        # Sending only queues: the rate that counts includes waiting for the broker's acks.
        producer.close(timeout=120.0)
        show(task, len(records))


def _progress_bar(show: bool) -> Progress:
    """Items produced of all, and the token rate, on stderr (disabled: nothing shown)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not show,
        transient=False,
    )


def _wait_until(producer: TokenProducer, due: float) -> None:
    """Sleep until ``due`` (monotonic), serving delivery reports meanwhile."""
    while True:
        left = due - time.monotonic()
        if left <= 0:
            return
        producer.poll(min(left, 0.1))
