"""A job as the OpenAI Batch API would report it: its status and its request counts.

Pure: a function of the job record (the jobs topic), so ``tokenfabric jobs`` and scripts that poll
a batch's status the OpenAI way agree. OpenAI's statuses and tokenfabric's states do not line up
one to one; the mapping (docs/jobs.md, "States"):

=====================================================  ==============
tokenfabric                                            OpenAI status
=====================================================  ==============
``submitting`` (submit is reading and checking rows)   ``validating``
``aborted`` (submit stopped: too many bad rows, ...)   ``failed``
``submitted``, some rows without a result              ``in_progress``
... and some rows already ``cancelled``, or a cancel   ``cancelling``
``submitted``, every row has a result (counted by      ``finalizing``
``jobs --scan``; no collector has written it yet)
``finished``, some rows ``cancelled``                  ``cancelled``
``finished``, else some rows ``expired``               ``expired``
``finished``, else                                     ``completed``
=====================================================  ==============

OpenAI's ``failed`` means the input file failed validation; a finished job with failed rows is
``completed``, as an OpenAI batch whose requests failed is, and the rows are counted in ``failed``.
Counts: ``total`` is every row of the dataset, ``completed`` the rows with an ok result, ``failed``
every other row with an outcome (failed, rejected, cancelled, expired, and the rows submit refused).
A retry attempt (``NAME.r2``) counts the rows it runs again: its ``total`` is its items.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from processor.jobs.model import JobRecord

OpenAIStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
OPENAI_STATUSES: tuple[OpenAIStatus, ...] = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)


@dataclass(frozen=True, slots=True)
class OpenAIBatchView:
    """A job's OpenAI ``status`` and ``request_counts`` (``total``, ``completed``, ``failed``)."""

    status: OpenAIStatus
    total: int
    completed: int
    failed: int

    @property
    def counts(self) -> str:
        """``total/completed/failed``, the column ``tokenfabric jobs`` prints."""
        return f"{self.total:,}/{self.completed:,}/{self.failed:,}"


def openai_status(job: JobRecord, *, cancel_requested: bool = False) -> OpenAIStatus:
    """The OpenAI status of ``job`` (module docstring). ``cancel_requested``: someone asked to cancel
    it and its cancelled rows may not all be counted yet."""
    if job.state == "submitting":
        return "validating"
    if job.state == "aborted":
        return "failed"
    if job.results_ok + job.results_failed < job.items:
        return "cancelling" if cancel_requested or job.results_cancelled > 0 else "in_progress"
    if job.state != "finished":
        return "finalizing"
    if job.results_cancelled > 0:
        return "cancelled"
    if job.results_expired > 0:
        return "expired"
    return "completed"


def openai_view(job: JobRecord, *, cancel_requested: bool = False) -> OpenAIBatchView:
    """``job``'s OpenAI status and request counts (module docstring)."""
    return OpenAIBatchView(
        status=openai_status(job, cancel_requested=cancel_requested),
        total=job.items if job.retry_of is not None else job.rows,
        completed=job.results_ok,
        failed=job.results_failed + len(job.bad_rows),
    )
