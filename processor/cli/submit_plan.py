"""``tokenfabric submit``'s arguments checked into a :class:`SubmitPlan` before anything is produced:
which kind of input (prompt template, chat messages, an OpenAI batch input), how its rows become
items, the model and the output budget (processor/cli/submit.py produces the plan's rows)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from processor.jobs.model import MAX_BAD_ROWS, check_job_name
from processor.jobs.prepare import JobRows
from processor.jobs.templates import Template

if TYPE_CHECKING:
    from processor.jobs.chat import ChatTemplate, Message
    from processor.jobs.datasets import Dataset
    from processor.jobs.prepare import RowReader, SettingsSource
    from processor.jobs.textprep import TextTokenizer


@dataclass(frozen=True, slots=True)
class SubmitPlan:
    """Everything submit needs, checked before anything is produced.

    ``rows`` says how rows become items; None means the prompt ``template`` with no settings.
    ``output_budget`` is every item's unless the row's settings give ``max_tokens``.
    """

    job: str
    template: Template | None
    dataset: Dataset
    tokenizer: TextTokenizer
    model: str
    output_budget: int | None
    max_bad_rows: int
    rows: JobRows | None = None
    options: str | None = None
    """The options that decide how rows become items, as the job record keeps them (for retries)."""
    adapter: str = ""
    """The job-wide ``--request``'s LoRA adapter ("" for the base model): what submit warns about
    when no consumer serves it (an adapter a row's own settings name is not known before its row)."""

    @property
    def job_rows(self) -> JobRows:
        if self.rows is not None:
            return self.rows
        if self.template is None:
            raise ValueError("a plan needs a template or rows")
        return JobRows.from_template(self.template)


def plan_from(args: argparse.Namespace) -> SubmitPlan:
    """Raises ValueError (TemplateError, DatasetError, TokenizerError, ChatTemplateError,
    SettingsError) with one line to print. Chat and OpenAI inputs are read once here (prepare.scan)."""
    from processor.jobs.datasets import Dataset
    from processor.jobs.prepare import SettingsSource
    from processor.jobs.retry import item_options
    from processor.jobs.settings import load_job_settings
    from processor.jobs.templates import load_template
    from processor.jobs.textprep import TextTokenizer

    if args.dataset is None or args.job is None:
        raise ValueError("give DATASET and --job NAME (or --retry-failed NAME)")
    job = check_job_name(args.job)
    if not 0 <= args.max_bad_rows <= MAX_BAD_ROWS:
        raise ValueError(f"--max-bad-rows must be 0-{MAX_BAD_ROWS:,} (the job record lists every bad row)")
    if args.output_budget is not None and args.output_budget < 0:
        raise ValueError(f"--output-budget must be >= 0, got {args.output_budget}")
    dataset = Dataset(args.dataset)
    tokenizer = TextTokenizer(args.tokenizer)
    settings = SettingsSource(load_job_settings(args.request) if args.request else {}, args.request_column)
    kind = _input_kind(args, dataset)
    budget = args.output_budget
    if kind == "openai":
        rows, model = _openai_rows(args, dataset, tokenizer, settings)
        template = None
    elif kind == "chat":
        _check_columns(dataset, [args.messages_column], f"--messages-column {args.messages_column}")
        rows, model, template = _chat_rows(args, dataset, tokenizer, settings), args.model or "default", None
    else:
        template = load_template(Path(args.template).resolve())
        _check_columns(dataset, template.columns, f"template {args.template}")
        rows = JobRows.from_template(template, settings)
        model = args.model or template.model or "default"
        budget = budget if budget is not None else template.output_budget
    if args.request_column is not None:
        _check_columns(dataset, [args.request_column], f"--request-column {args.request_column}")
    options = item_options(args)
    adapter = str(settings.job.get("adapter") or "")
    return SubmitPlan(
        job, template, dataset, tokenizer, model, budget, args.max_bad_rows, rows, options, adapter
    )


def _input_kind(args: argparse.Namespace, dataset: Dataset) -> str:
    """``openai``, ``chat`` or ``template``, from the arguments and (``--input-format auto``) the
    first parsed line of a JSONL dataset."""
    from processor.jobs.openai_input import looks_like_openai_batch

    prompt_args = [a for a in ("template", "messages_column") if getattr(args, a) is not None]
    openai = args.input_format == "openai"
    if args.input_format == "auto" and not prompt_args and dataset.format == "jsonl":
        first = next((r for r in dataset.rows() if r.values is not None), None)
        if first is None:
            raise ValueError(f"{dataset.path.name} has no JSON lines: nothing to submit")
        openai = looks_like_openai_batch(first.values)
        if not openai and first.values is not None and _openai_keys & set(first.values):
            raise ValueError(
                f"the first JSON line of {dataset.path.name} has no {_missing(first.values)}: an OpenAI "
                'batch input line is {"custom_id": ..., "method": "POST", "url": ..., "body": {...}}'
            )
    if openai:
        if dataset.format != "jsonl":
            raise ValueError(f"an OpenAI batch input is a .jsonl file, not {dataset.path.name}")
        extra = prompt_args + (["request_column"] if args.request_column is not None else [])
        if extra:
            flags = ", ".join("--" + a.replace("_", "-") for a in extra)
            raise ValueError(f"{flags}: an OpenAI batch input carries its prompts and settings in each body")
        return "openai"
    if len(prompt_args) != 1:
        raise ValueError(
            "give --template T (rows rendered with a prompt template) or --messages-column COL (chat rows), "
            "not both; an OpenAI batch input .jsonl needs neither"
        )
    return "template" if args.template is not None else "chat"


#: Keys only an OpenAI batch input line has: a first line with one of them but not both of
#: ``custom_id`` and ``body`` is a broken OpenAI line, not a row for a template.
_openai_keys = frozenset({"custom_id", "body", "method", "url"})


def _missing(values: dict[str, object]) -> str:
    return " or ".join(k for k in ("custom_id", "body") if k not in values)


def _check_columns(dataset: Dataset, columns: Iterable[str], user: str) -> None:
    """A setup error when a CSV's or Parquet's header lacks a column ``user`` needs (JSONL has none)."""
    if dataset.columns is None:
        return
    absent = [c for c in columns if c not in dataset.columns]
    if absent:
        raise ValueError(
            f"{user} uses column(s) {', '.join(map(repr, absent))} that {dataset.path.name} "
            f"does not have (its columns: {', '.join(dataset.columns)})"
        )


def _chat_template(args: argparse.Namespace, tokenizer: TextTokenizer) -> ChatTemplate:
    """``--chat-template``, else the one in the tokenizer's folder (a Hugging Face model folder's)."""
    from processor.jobs.chat import find_chat_template, load_chat_template

    if args.chat_template is not None:
        return load_chat_template(Path(args.chat_template))
    found = find_chat_template(tokenizer.path.parent)
    if found is None:
        raise ValueError(
            f"chat messages need the model's chat template: pass --chat-template (a tokenizer_config.json, "
            f"a .jinja file or the model's folder); {tokenizer.path.parent} has none"
        )
    return load_chat_template(found)


def _chat_rows(
    args: argparse.Namespace, dataset: Dataset, tokenizer: TextTokenizer, settings: SettingsSource
) -> JobRows:
    from processor.jobs.prepare import ChatRows, scan

    reader = ChatRows(args.messages_column, settings)
    return _with_chat(args, tokenizer, reader, scan(reader, dataset.rows()).leading, str)


def _openai_rows(
    args: argparse.Namespace, dataset: Dataset, tokenizer: TextTokenizer, settings: SettingsSource
) -> tuple[JobRows, str]:
    """The rows of an OpenAI batch input and the job's model: ``--model``, else the first line's
    (lines naming another model name its LoRA adapters: prepare.OpenAIRows)."""
    from processor.jobs.chat import NO_SHAPE
    from processor.jobs.openai_input import job_template_field
    from processor.jobs.prepare import OpenAIRows, Shaper, scan

    reader = OpenAIRows(settings, model=args.model, override=args.model is not None)
    found = scan(reader, dataset.rows())
    model = args.model or found.first_model or "default"
    reader.model, reader.file_model = model, found.first_model
    if not found.has_messages:
        return JobRows(reader, Shaper(), NO_SHAPE, job_template_field(None)), model
    return _with_chat(args, tokenizer, reader, found.leading, job_template_field), model


def _with_chat(
    args: argparse.Namespace,
    tokenizer: TextTokenizer,
    reader: RowReader,
    leading: Sequence[Message],
    source: Callable[[str], str],
) -> JobRows:
    """Rows read by ``reader`` rendered with the chat template, shaped by the ``leading`` messages
    they share; ``source(chat template path)`` is the job record's ``template``."""
    from processor.jobs.prepare import chat_shaper

    chat = _chat_template(args, tokenizer)
    shaper = chat_shaper(chat, leading, tokenizer)
    return JobRows(reader, shaper, shaper.prefix.shape, source(chat.source))
