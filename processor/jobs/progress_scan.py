"""A job's progress counted from the results topic alone (``tokenfabric jobs --scan``): no journal,
no output file, one pass over the results written since the oldest job started."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from processor.core.retries import DEFAULT_MAX_ATTEMPTS
from processor.jobs.collect import provisional, row_result
from processor.jobs.model import JobRecord, RowResult, job_of, row_of, summarize
from processor.jobs.results_tail import START_SLACK_MS, ResultsTail
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions
from processor.wire.errors import DecodeError


@dataclass(frozen=True, slots=True)
class Progress:
    """A job's progress counted from the results topic (``tokenfabric jobs --scan``); ``failed``
    counts every result that is not ok, ``cancelled`` and ``expired`` are parts of it."""

    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    cancelled: int = 0
    expired: int = 0


def scan_progress(
    conf: Mapping[str, str],
    topics: TopicNames,
    jobs: Mapping[str, JobRecord],
    max_s: float = 120.0,
    max_attempts: Mapping[str, int] | None = None,
) -> dict[str, Progress]:
    """Count each job's distinct rows with a result, reading results since the oldest job started.

    A row's result is its completion of the greatest attempt (a retry inside the pipeline), and a
    completion another attempt follows is none (:func:`provisional`; ``max_attempts`` by job, as
    :func:`max_attempts_by_job` gives it)."""
    limits = max_attempts or {}
    if not jobs:
        return {}
    tail = ResultsTail(conf, topics)
    seen: dict[str, dict[int, RowResult]] = {name: {} for name in jobs}
    try:
        tail.assign(tail.offsets_at(min(j.started_ms for j in jobs.values()) - START_SLACK_MS))
        for msg in tail.drain(max_s):
            try:
                completions = decode_completions(msg.value())
            except DecodeError:
                continue
            for c in completions:
                name = job_of(c.item_id)
                rows = seen.get(name)
                row = row_of(name, c.item_id) if rows is not None else None
                if rows is not None and row is not None:
                    if provisional(c, limits.get(name, DEFAULT_MAX_ATTEMPTS)):
                        continue
                    result = row_result(row, c, attempt=1)
                    if result.supersedes(rows.get(row)):
                        rows[row] = result
    finally:
        tail.close()
    out: dict[str, Progress] = {}
    for name, rows in seen.items():
        s = summarize(jobs[name], rows.values())
        out[name] = Progress(s.ok, s.failed, s.output_tokens, s.cancelled, s.expired)
    return out
