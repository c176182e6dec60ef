"""What the ledger's checks and checkpoint read and write of a ledger: :class:`LedgerBooks`.

core/ledger_checks.py and core/ledger_checkpoint.py type their ``ledger`` against this protocol
rather than against :class:`~processor.core.accounting.Ledger`, which calls them: accounting imports
the two, they import this face, and it imports only core/books.py, so no import runs back up. The
``Ledger`` is the one class that has this face; a change to what the two read is made here too.
"""

from __future__ import annotations

from typing import Protocol

from processor.core.books import ConsumerBook, JobBook, ModelBook, Tally


class LedgerBooks(Protocol):
    """The ledger's books by model, consumer and job, their totals, and its own checks.

    ``dead_lettered`` and ``prompts_counted`` are written by a restore; the books are made on
    first use by :meth:`model`, :meth:`consumer` and :meth:`job`, and stay for the ledger's life."""

    models: dict[str, ModelBook]
    consumers: dict[str, ConsumerBook]
    jobs: dict[str, JobBook]
    dead_lettered: int
    prompts_counted: bool

    def model(self, model: str) -> ModelBook: ...
    def consumer(self, consumer: str) -> ConsumerBook: ...
    def job(self, job: str) -> JobBook: ...
    def total(self, stage: str) -> Tally: ...
    def cached_total(self) -> Tally: ...
    def check(self) -> None: ...
    def check_jobs(self) -> None: ...
