"""``tokenfabric submit DATASET --job NAME --template T``: a dataset becomes a job's items, then exit.

Each data row is rendered with the template, tokenised with a real tokenizer and produced as one
TokenItem with ``job_id=NAME``, ``item_id=NAME:<row>`` and the template's shape. The job is recorded
on the jobs topic twice: ``submitting`` before the first item (so collectors know it exists) and
``submitted`` once every item is acknowledged, with the rows, items, tokens and bad rows. Results are
gathered later, by ``tokenfabric collect`` or the ``collector`` service (decoupled: nothing waits).

Bad rows (unparseable, a missing or null column, refused by the tokenizer) are never skipped quietly:
each is printed to stderr with its row number and listed in the job record, and ``collect`` writes it
to the output with status ``invalid``. Submit carries on past them, because one bad row in a million
should not hold up the rest, but exits 3 so a script notices; ``--allow-bad-rows`` makes that 0.
More than ``--max-bad-rows`` (default 100, at most 1,000) usually means a wrong template or dataset:
submit then stops, records the job as ``aborted`` and exits 1.

Job names are single-use: item ids are ``NAME:<row>``, so a second submission under one name could
not be told apart from the first on the results topic.

Exit status: 0 every row submitted (or bad rows allowed); 3 submitted, some rows bad; 2 bad
arguments, unreadable template/dataset/tokenizer, a job name in use, a missing topic; 1 aborted (too
many bad rows, or Kafka failed); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from processor.cli.options import (
    add_job_policy_arguments,
    add_kafka_arguments,
    job_policy_from,
    kafka_settings,
)
from processor.jobs.model import MAX_BAD_ROWS, BadRow, JobRecord, check_job_name, item_id
from processor.jobs.templates import RowError, Template

if TYPE_CHECKING:
    from processor.apps.producer import TokenProducer
    from processor.jobs.datasets import Dataset, DatasetRow
    from processor.jobs.textprep import TextTokenizer
    from processor.jobs.topic import JobWriter
    from processor.kafka.topics import TopicNames

PROG = "tokenfabric submit"
CHUNK_ROWS = 512
PRINTED_BAD_ROWS = 20


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="rows to submit: .jsonl, .csv or .parquet (.jsonl.gz and .csv.gz too)")
    p.add_argument("--job", required=True, help="job name: 1-100 of A-Z a-z 0-9 . _ -, not used before")
    p.add_argument("--template", required=True, help="prompt template, .toml or .json (docs/jobs.md)")
    p.add_argument(
        "--model", default=None, help="model of every item (default: the template's, else 'default')"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json, or a folder with one (default: the MiniLM package's)",
    )
    p.add_argument(
        "--output-budget",
        type=int,
        default=None,
        help="output tokens per item (default: the template's, or none)",
    )
    p.add_argument("--allow-bad-rows", action="store_true", help="exit 0 even if some rows were bad")
    p.add_argument(
        "--max-bad-rows",
        type=int,
        default=100,
        help=f"abort past this many bad rows (default: 100, at most {MAX_BAD_ROWS:,})",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_job_policy_arguments(p)
    add_kafka_arguments(p)


@dataclass(frozen=True, slots=True)
class SubmitPlan:
    """Everything submit needs, checked before anything is produced."""

    job: str
    template: Template
    dataset: Dataset
    tokenizer: TextTokenizer
    model: str
    output_budget: int | None
    max_bad_rows: int


class Aborted(RuntimeError):
    """Submit stopped early; the job record says ``aborted`` with this message as its error."""


def plan_from(args: argparse.Namespace) -> SubmitPlan:
    """Raises ValueError (TemplateError, DatasetError, TokenizerError) with one line to print."""
    from processor.jobs.datasets import Dataset
    from processor.jobs.templates import load_template
    from processor.jobs.textprep import TextTokenizer

    job = check_job_name(args.job)
    if not 0 <= args.max_bad_rows <= MAX_BAD_ROWS:
        raise ValueError(f"--max-bad-rows must be 0-{MAX_BAD_ROWS:,} (the job record lists every bad row)")
    if args.output_budget is not None and args.output_budget < 0:
        raise ValueError(f"--output-budget must be >= 0, got {args.output_budget}")
    template = load_template(Path(args.template).resolve())
    dataset = Dataset(args.dataset)
    if dataset.columns is not None:
        absent = [c for c in template.columns if c not in dataset.columns]
        if absent:
            raise ValueError(
                f"template {args.template} uses column(s) {', '.join(map(repr, absent))} that {args.dataset} "
                f"does not have (its columns: {', '.join(dataset.columns)})"
            )
    model = args.model or template.model or "default"
    budget = args.output_budget if args.output_budget is not None else template.output_budget
    return SubmitPlan(job, template, dataset, TextTokenizer(args.tokenizer), model, budget, args.max_bad_rows)


def _chunks(rows: Iterable[DatasetRow], size: int) -> Iterator[list[DatasetRow]]:
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def submit(
    plan: SubmitPlan,
    producer: TokenProducer,
    writer: JobWriter,
    *,
    on_bad: Callable[[BadRow], None] = lambda b: None,
    on_rows: Callable[[int, int], None] = lambda rows, tokens: None,
) -> JobRecord:
    """Produce every good row of ``plan``'s dataset and record the job; returns the final record.

    Raises :class:`Aborted` past ``max_bad_rows`` (after recording the job as aborted); Kafka errors
    propagate after the same attempt to record it.
    """
    from processor.jobs.datasets import file_sha256
    from processor.wire.records import tokens_from_ids

    t = plan.template
    record = JobRecord(
        name=plan.job,
        state="submitting",
        dataset=str(plan.dataset.path),
        dataset_sha256=file_sha256(plan.dataset.path),
        template=str(t.source),
        shape=t.shape,
        model=plan.model,
        tokenizer=str(plan.tokenizer.path),
        started_ms=_now_ms(),
    )
    writer.write(record)
    rows = items = tokens = 0
    bad: list[BadRow] = []

    def finish(state: str, error: str | None) -> JobRecord:
        listed = tuple(sorted(bad, key=lambda b: b.row)[:MAX_BAD_ROWS])
        final = replace(record, rows=rows, items=items, input_tokens=tokens, bad_rows=listed, error=error)
        if state == "submitted":
            final = replace(final, state="submitted", submitted_ms=_now_ms())
        else:
            final = replace(final, state="aborted")
        writer.write(final)
        return final

    try:
        for chunk in _chunks(plan.dataset.rows(), CHUNK_ROWS):
            texts: list[str] = []
            good: list[int] = []
            found: list[BadRow] = []
            for drow in chunk:
                rows += 1
                if drow.error is not None or drow.values is None:
                    found.append(BadRow(drow.row, drow.error or "no values"))
                    continue
                try:
                    texts.append(t.render(drow.values))
                    good.append(drow.row)
                except RowError as exc:
                    found.append(BadRow(drow.row, str(exc)))
            for row, enc in zip(good, plan.tokenizer.encode_many(texts), strict=True):
                if enc.error is not None or not enc.ids:
                    found.append(BadRow(row, enc.error or "the prompt has no tokens"))
                    continue
                producer.send(
                    item_id(plan.job, row),
                    plan.model,
                    tokens_from_ids(enc.ids),
                    shape=t.shape,
                    job_id=plan.job,
                    output_budget=plan.output_budget,
                )
                items += 1
                tokens += len(enc.ids)
            for b in sorted(found, key=lambda b: b.row):
                bad.append(b)
                on_bad(b)
            on_rows(rows, tokens)
            if len(bad) > plan.max_bad_rows:
                raise Aborted(f"more than {plan.max_bad_rows} bad rows (--max-bad-rows): check the template")
        producer.close(timeout=120.0)
    except BaseException as exc:
        _record_failure(producer, finish, exc)
        raise
    return finish("submitted", None)


def _record_failure(
    producer: TokenProducer, finish: Callable[[str, str | None], JobRecord], exc: BaseException
) -> None:
    """Deliver what was queued and mark the job aborted; never hides the original error."""
    reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc) or type(exc).__name__
    # The original error is the one to report; these are best effort.
    with contextlib.suppress(Exception):
        producer.flush(60.0)
    with contextlib.suppress(Exception):
        finish("aborted", reason)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.apps.producer import MissingTopicError, ProduceError, TokenProducer
    from processor.jobs.topic import JobsTopicError, JobWriter, read_jobs
    from processor.kafka.config import ConfigError

    try:
        plan = plan_from(args)
        policy = job_policy_from(args)
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    printed = 0

    def on_bad(b: BadRow) -> None:
        nonlocal printed
        printed += 1
        if printed <= PRINTED_BAD_ROWS:
            print(f"{PROG}: bad row {b.row}: {b.reason}", file=sys.stderr)

    writer: JobWriter | None = None
    try:
        try:
            producer = TokenProducer(conf, topics)
            producer.check_topic()
            writer = JobWriter(conf, topics)
            writer.check_topic()
            existing = read_jobs(conf, topics).get(plan.job)
        except (MissingTopicError, JobsTopicError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        if existing is not None:
            print(
                f"{PROG}: error: job {plan.job} already exists ({existing.state}, started_ms "
                f"{existing.started_ms}); job names are single-use, pick another --job",
                file=sys.stderr,
            )
            return 2
        _warn_if_unserved(plan.model, conf, topics)
        if policy is not None:  # before the first item, so the processors weigh it from the start
            writer.write_share(plan.job, policy, time.time_ns() // 1_000_000)
        with _progress(not args.no_progress) as on_rows:
            final = submit(plan, producer, writer, on_bad=on_bad, on_rows=on_rows)
    except (Aborted, KafkaException, ProduceError, JobsTopicError) as exc:
        print(f"{PROG}: error: job {plan.job} aborted: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: job {plan.job} recorded as aborted", file=sys.stderr)
        return 130
    finally:
        if writer is not None:
            writer.close()
    if printed > PRINTED_BAD_ROWS:
        print(
            f"{PROG}: ... {printed - PRINTED_BAD_ROWS} more bad rows: 'tokenfabric jobs {plan.job}'",
            file=sys.stderr,
        )
    print(
        f"submitted job {final.name}: {final.items:,} of {final.rows:,} rows, {final.input_tokens:,} tokens, "
        f"model {final.model}, shape {final.shape:016x}, {len(final.bad_rows)} bad rows; "
        f"collect with 'tokenfabric collect --job {final.name} --out FILE'"
    )
    if final.bad_rows and not args.allow_bad_rows:
        return 3
    return 0


def _warn_if_unserved(model: str, conf: dict[str, str], topics: TopicNames) -> None:
    """One line when no consumer has announced ``model``: the job's items would wait, parked, until
    one does, and ``collect --wait`` would count them missing without saying why."""
    from processor.ops.contracts import announced_contracts, consumers_of

    if not consumers_of(model, announced_contracts(conf, topics)):
        print(
            f"{PROG}: warning: no consumer serves model {model!r} on {topics.contracts}; the job's items "
            "wait until one announces it ('tokenfabric status' lists them as UNSERVED)",
            file=sys.stderr,
        )


class _progress:
    """A rich progress line on stderr (rows and tokens so far), or nothing."""

    def __init__(self, show: bool) -> None:
        self.show = show

    def __enter__(self) -> Callable[[int, int], None]:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("submitting {task.fields[rows]:,} rows, {task.fields[tokens]:,} tokens"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not self.show,
        )
        self._progress.__enter__()
        task = self._progress.add_task("submit", total=None, rows=0, tokens=0)
        return lambda rows, tokens: self._progress.update(task, rows=rows, tokens=tokens)

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)
