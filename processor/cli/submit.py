"""``tokenfabric submit DATASET --job NAME --template T``: a dataset becomes a job's items, then exit.

Each data row is rendered (with the prompt template; or its chat ``messages`` with the model's chat
template, ``--messages-column``; or, for an OpenAI batch input file, its body's ``prompt`` or
``messages``), tokenised with a real tokenizer and produced as one TokenItem with ``job_id=NAME``,
``item_id=NAME:<row>``, the job's shape and the row's generation settings (``--request``,
``--request-column``, an OpenAI body's): processor/jobs/prepare.py has the rules. The job is recorded
on the jobs topic twice: ``submitting`` before the first item (so collectors know it exists) and
``submitted`` once every item is acknowledged, with the rows, items, tokens and bad rows. Results are
gathered later, by ``tokenfabric collect`` or the ``collector`` service (decoupled: nothing waits).

Bad rows (unparseable, a missing or null column, invalid settings, refused by the chat template or
the tokenizer) are never skipped quietly: each is printed to stderr with its row number and listed in
the job record, and ``collect`` writes it to the output with status ``invalid``. Submit carries on
past them, because one bad row in a million should not hold up the rest, but exits 3 so a script
notices; ``--allow-bad-rows`` makes that 0.
More than ``--max-bad-rows`` (default 100, at most 1,000) usually means a wrong template or dataset:
submit then stops, records the job as ``aborted`` and exits 1.

Job names are single-use: item ids are ``NAME:<row>``, so a second submission under one name could
not be told apart from the first on the results topic. The options that decide how rows become items
are recorded with the job, so ``--retry-failed NAME`` (processor/cli/retry_failed.py) renders the
rows it runs again exactly as the job did.

Exit status: 0 every row submitted (or bad rows allowed); 3 submitted, some rows bad; 2 bad
arguments, unreadable template/dataset/tokenizer, a job name in use, a missing topic; 1 aborted (too
many bad rows, or Kafka failed); 130 interrupted.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from processor.cli.hints import kafka_flags
from processor.cli.options import (
    add_job_policy_arguments,
    add_kafka_arguments,
    job_policy_from,
    kafka_settings,
)
from processor.cli.submission import Aborted, submit
from processor.cli.submit_plan import SubmitPlan, plan_from
from processor.jobs.model import MAX_BAD_ROWS, BadRow
from processor.sim.columns import folded

if TYPE_CHECKING:
    from processor.core.contract import Contract
    from processor.core.shares import JobPolicy
    from processor.jobs.topic import JobWriter
    from processor.kafka.topics import TopicNames

__all__ = ["PROG", "Aborted", "SubmitPlan", "configure", "plan_from", "run", "submit"]

PROG = "tokenfabric submit"
PRINTED_BAD_ROWS = 20


def configure(p: argparse.ArgumentParser) -> None:
    _add_input_arguments(p)
    _add_item_arguments(p)
    _add_limit_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_job_policy_arguments(p)
    add_kafka_arguments(p)


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    """What is submitted and how its rows are read: the dataset, the job, the kind of input."""
    p.add_argument(
        "dataset",
        nargs="?",
        help="rows to submit: .jsonl, .csv or .parquet (.jsonl.gz and .csv.gz too); with --retry-failed, "
        "where the job's dataset is if not at its recorded path",
    )
    p.add_argument("--job", help="job name: 1-100 of A-Z a-z 0-9 . _ -, not used before")
    p.add_argument(
        "--retry-failed",
        metavar="NAME",
        default=None,
        help="submit a new attempt for the rows of finished job NAME that failed or expired (docs/jobs.md)",
    )
    p.add_argument(
        "--template", metavar="T", default=None, help="prompt template, .toml or .json (docs/jobs.md)"
    )
    p.add_argument(
        "--messages-column",
        metavar="COL",
        default=None,
        help="chat rows: the column holding each row's messages, rendered with the chat template",
    )
    p.add_argument(
        "--chat-template",
        metavar="PATH",
        default=None,
        help="a tokenizer_config.json, a .jinja file or a model folder (default: the tokenizer's folder's)",
    )
    p.add_argument(
        "--input-format",
        choices=("auto", "rows", "openai"),
        default="auto",
        help="openai: an OpenAI batch input .jsonl; auto (default): openai when the first line has "
        "custom_id and body and no --template/--messages-column is given",
    )


def _add_item_arguments(p: argparse.ArgumentParser) -> None:
    """How a row becomes an item: its generation settings, model, tokenizer and output budget."""
    p.add_argument(
        "--request",
        metavar="JSON",
        default=None,
        help="generation settings of every row: a JSON object, or @FILE (docs/jobs.md, per-row settings)",
    )
    p.add_argument(
        "--request-column",
        metavar="COL",
        default=None,
        help="the column holding each row's own settings (a JSON object), over --request field by field",
    )
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


def _add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """What the job tolerates: bad rows, its completion window or deadline, attempts per row."""
    p.add_argument("--allow-bad-rows", action="store_true", help="exit 0 even if some rows were bad")
    p.add_argument(
        "--max-bad-rows",
        type=int,
        default=100,
        help=f"abort past this many bad rows (default: 100, at most {MAX_BAD_ROWS:,})",
    )
    p.add_argument(
        "--window",
        metavar="DURATION",
        default=None,
        help="completion window: rows not dispatched within this long (24h, 90m, 30s) end 'expired'",
    )
    p.add_argument(
        "--deadline",
        metavar="ISO-TIME",
        default=None,
        help="rows not dispatched by then (ISO 8601, UTC unless zoned) end 'expired'",
    )
    p.add_argument(
        "--max-attempts",
        metavar="N",
        default=None,
        help="dispatches each row gets in all when its engine fails it for a reason worth another try "
        "(a timeout, a server error; not a rejected prompt): default 3, 1 for no retry",
    )


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.apps.producer import MissingTopicError, ProduceError, TokenProducer
    from processor.jobs.topic import JobsTopicError, JobWriter, read_jobs
    from processor.kafka.config import ConfigError
    from processor.ops.lifecycle import LifecycleError, deadline_from, max_attempts_from

    if args.retry_failed is not None:
        from processor.cli.retry_failed import run_retry_failed

        return run_retry_failed(args)
    try:
        max_attempts = max_attempts_from(args.max_attempts)  # first: a typo costs no dataset read
        plan = plan_from(args)
        policy = job_policy_from(args)
        deadline_ms = deadline_from(args.window, args.deadline, time.time_ns() // 1_000_000)
        conf, topics = kafka_settings(args, pipeline=True)
    except (ValueError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    on_bad = _BadRowPrinter()
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
        contracts = _announced(conf, topics)
        _warn_if_unserved(plan.model, plan.adapter, contracts, topics, kafka_flags(args))
        _served_adapters(plan, contracts)
        _record_terms(writer, conf, topics, plan.job, policy, deadline_ms, max_attempts)
        with _progress(not args.no_progress) as on_rows:
            final = submit(plan, producer, writer, on_bad=on_bad, on_rows=on_rows)
    except (Aborted, KafkaException, ProduceError, JobsTopicError, LifecycleError) as exc:
        print(f"{PROG}: error: job {plan.job} aborted: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: job {plan.job} recorded as aborted", file=sys.stderr)
        return 130
    finally:
        if writer is not None:
            writer.close()
    on_bad.close(plan.job, kafka_flags(args))
    width = shutil.get_terminal_size((80, 24)).columns
    summary = (
        f"submitted job {final.name}: {final.items:,} of {final.rows:,} rows, {final.input_tokens:,} tokens, "
        f"model {final.model}, shape {final.shape:016x}, {len(final.bad_rows)} bad rows; "
        f"collect with 'tokenfabric collect --job {final.name} --out FILE{kafka_flags(args)}'"
    )
    print(folded(summary, width))
    if final.bad_rows and not args.allow_bad_rows:
        return 3
    return 0


class _BadRowPrinter:
    """Prints the first :data:`PRINTED_BAD_ROWS` bad rows to stderr, then how many more there were."""

    def __init__(self) -> None:
        self.printed = 0

    def __call__(self, b: BadRow) -> None:
        self.printed += 1
        if self.printed <= PRINTED_BAD_ROWS:
            print(f"{PROG}: bad row {b.row}: {b.reason}", file=sys.stderr)

    def close(self, job: str, flags: str = "") -> None:
        if self.printed > PRINTED_BAD_ROWS:
            print(
                f"{PROG}: ... {self.printed - PRINTED_BAD_ROWS} more bad rows: "
                f"'tokenfabric jobs {job}{flags}'",
                file=sys.stderr,
            )


def _record_terms(
    writer: JobWriter,
    conf: dict[str, str],
    topics: TopicNames,
    job: str,
    policy: JobPolicy | None,
    deadline_ms: int | None,
    max_attempts: int | None,
) -> None:
    """The job's share policy, then its deadline and attempts, before its first item (so the
    processors weigh and time it from the start)."""
    from processor.ops.lifecycle import record_deadline

    if policy is not None:
        writer.write_share(job, policy, time.time_ns() // 1_000_000)
    if deadline_ms is not None or max_attempts is not None:  # after the share, which writes neither
        now_ms = time.time_ns() // 1_000_000
        record_deadline(conf, topics, job, deadline_ms, now_ms, max_attempts=max_attempts)


def _announced(conf: dict[str, str], topics: TopicNames) -> dict[str, Contract]:
    from processor.ops.contracts import announced_contracts

    return announced_contracts(conf, topics)


def _served_adapters(plan: SubmitPlan, contracts: dict[str, Contract]) -> None:
    """An OpenAI input's lines may name LoRA adapters of the job's model: those some consumer serves
    (prepare.OpenAIRows makes a line naming another one bad)."""
    from processor.core.serving import split_serving_key
    from processor.jobs.prepare import OpenAIRows

    reader = plan.rows.reader if plan.rows is not None else None
    if isinstance(reader, OpenAIRows):
        keys = (split_serving_key(c.model) for c in contracts.values())
        reader.adapters = frozenset(adapter for model, adapter in keys if model == plan.model and adapter)


def _warn_if_unserved(
    model: str, adapter: str, contracts: dict[str, Contract], topics: TopicNames, flags: str = ""
) -> None:
    """One line when no consumer has announced ``model`` (with ``adapter``): the job's items would
    wait, parked, until one does, and ``collect --wait`` would count them missing without saying why."""
    from processor.ops.contracts import unserved_keys, unserved_names

    missing = unserved_keys(model, [adapter], contracts)
    if missing:
        print(
            f"{PROG}: warning: no consumer serves {unserved_names(missing)} on {topics.contracts}; "
            "the job's items wait until one announces it "
            f"('tokenfabric status{flags}' lists them as UNSERVED)",
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
