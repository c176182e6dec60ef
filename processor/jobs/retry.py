"""Retrying a finished job's failed rows as a new attempt (``tokenfabric submit --retry-failed NAME``).

Job names are single-use (an item id ``NAME:<row>`` must name one submission), so an attempt is a
job of its own:

* attempt ``k`` (2, 3, ...) of job ``NAME`` is the job ``NAME.r<k>``, whose record says
  ``retry_of = NAME`` and ``attempt = k`` (schemas/Job.avsc);
* its items are the rows of ``NAME`` whose result, after every earlier attempt, is ``failed`` or
  ``expired`` (:data:`~processor.jobs.model.RETRIED_STATUSES`), rendered again from ``NAME``'s
  dataset with ``NAME``'s options (:func:`item_options`, recorded by submit), under their own row
  numbers: row 17 of ``NAME`` is item ``NAME.r2:17``. So they map back to ``NAME``'s rows without a
  table, and ``collect --job NAME`` merges them: each row's result is the one from the last attempt
  that ran it (:meth:`~processor.jobs.model.RowResult.supersedes`).
* an attempt starts only once ``NAME`` and every earlier attempt have a result for each of their
  rows (:func:`retry_problem`); so the rows of attempt ``k + 1`` are a subset of attempt ``k``'s,
  which is what lets a collector count an attempt's rows still to come from its results alone.

Pure: the Kafka side (reading the results, producing the items) is processor/cli/retry_failed.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from processor.jobs.datasets import Dataset, DatasetRow
from processor.jobs.model import RETRIED_STATUSES, JobRecord, JobSummary, RowResult, check_job_name

#: The submit options that decide how a row becomes an item: recorded with the job (JSON), read
#: back for its retry attempts. Paths are recorded resolved; ``--request @FILE`` as the file's text.
ITEM_OPTIONS = (
    "input_format",
    "template",
    "messages_column",
    "chat_template",
    "request",
    "request_column",
    "model",
    "tokenizer",
    "output_budget",
)
_PATH_OPTIONS = frozenset({"template", "chat_template", "tokenizer"})


def attempt_name(job: str, attempt: int) -> str:
    """The job name of attempt ``attempt`` (2 or more) of ``job``: ``<job>.r<attempt>``; ValueError
    when it would not be a valid job name (a name of 97+ characters)."""
    if attempt < 2:
        raise ValueError(f"attempt {attempt}: a retry is attempt 2 or later (attempt 1 is the job)")
    return check_job_name(f"{job}.r{attempt}")


def next_attempt(attempts: Iterable[JobRecord]) -> int:
    """The number of the attempt that follows ``attempts`` (a job's retry attempts): 2 for the first."""
    return 1 + max((a.attempt for a in attempts), default=1)


def rows_to_retry(results: Iterable[RowResult]) -> list[int]:
    """The rows whose latest result is one a retry runs again, in row order."""
    return sorted(r.row for r in results if r.status in RETRIED_STATUSES)


def retry_problem(job: JobRecord, summary: JobSummary) -> str | None:
    """Why ``job`` cannot get a retry attempt now (one line), or None when it can.

    Only a job, not an attempt (retry the job: its next attempt takes every row still failed), and
    only once every row of it and of its attempts has a result: a row still running may yet succeed,
    and an attempt's rows must be a subset of the previous attempt's (module docstring)."""
    if job.retry_of is not None:
        return f"{job.name} is attempt {job.attempt} of job {job.retry_of}: retry {job.retry_of} instead"
    if not job.is_submitted:
        return f"job {job.name} is still being submitted"
    if not summary.complete:
        waiting = summary.missing if summary.retrying == 0 else summary.retrying
        count = "?" if waiting is None else f"{waiting:,}"
        return (
            f"job {job.name} has rows without their result yet ({count} rows): collect it "
            f"('tokenfabric collect --job {job.name} --wait') and retry once it is complete"
        )
    return None


def item_options(args: Any) -> str:
    """The :data:`ITEM_OPTIONS` of submit's arguments, as the JSON text a job record keeps."""
    options: dict[str, Any] = {}
    for name in ITEM_OPTIONS:
        value = getattr(args, name, None)
        if value is not None and name in _PATH_OPTIONS:
            value = str(Path(value).resolve())
        elif isinstance(value, str) and name == "request" and value.startswith("@"):
            value = Path(value[1:]).read_text(encoding="utf-8")
        options[name] = value
    return json.dumps(options, sort_keys=True)


def recorded_options(job: JobRecord) -> dict[str, Any]:
    """The submit options a retry of ``job`` renders its rows with: those recorded with the job, or,
    for a job recorded without them, what its record says (template, model, tokenizer; an OpenAI
    batch input's chat template) and nothing else."""
    if job.options is not None:
        recorded = json.loads(job.options)
        if not isinstance(recorded, dict):
            raise ValueError(f"job {job.name}: its recorded options are not a JSON object")
        return {name: recorded.get(name) for name in ITEM_OPTIONS}
    from processor.jobs.openai_input import TEMPLATE_PREFIX, is_openai_job

    options: dict[str, Any] = dict.fromkeys(ITEM_OPTIONS)
    options.update(model=job.model, tokenizer=job.tokenizer)
    if is_openai_job(job):
        options.update(input_format="openai", chat_template=job.template[len(TEMPLATE_PREFIX) :] or None)
    else:
        options.update(input_format="rows", template=job.template)
    return options


class RowSubset(Dataset):
    """A dataset read for some of its rows only, each under its own row number (a retry attempt's)."""

    def __init__(self, path: str | Path, rows: Iterable[int]) -> None:
        super().__init__(path)
        self.wanted = frozenset(rows)

    def rows(self) -> Iterator[DatasetRow]:
        return (r for r in super().rows() if r.row in self.wanted)


def options_namespace(base: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Submit's arguments for an attempt: ``base`` (the command line's) with ``options`` over them,
    ``input_format`` defaulting to ``auto``."""
    merged = {**base, **{k: v for k, v in options.items() if k in ITEM_OPTIONS}}
    merged["input_format"] = merged.get("input_format") or "auto"
    return merged
