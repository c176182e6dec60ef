"""The scheduling core: items, shape signatures, contracts, rolling lanes, the scheduler and the ledger.

Pure Python over plain data, driven by the ``now_ms`` its caller passes: it imports no other project
package, no Kafka or Avro library, no clock and no logging (checked by import-linter in CI).

Public face: the names in ``__all__`` below, the ones docs/library.md builds a service from and
keeps stable ("What is stable" there); import them from ``processor.core``. The modules behind them:

- ``item``: :class:`Item` (a waiting request), :class:`Batch` (what a consumer is sent),
  :class:`ItemOutcome` (how one item was answered);
- ``contract``: :class:`Contract` (what a consumer accepts) and its :class:`BatchRule`;
- ``signature``: :func:`shape_signature` (an item's shape from its prompt's leading components);
- ``lanes`` (where waiting items sit; :class:`LaneSettings` in ``lane_settings``, one shape's lanes in
  ``shape_lanes``) and ``cut`` (which items leave together);
- ``dispatch`` (:class:`DispatchSettings`, the rules choosing a consumer's next lane), ``inflight``
  (what consumers hold) and ``scheduler`` (:class:`Scheduler`, the one object a caller drives; its
  state is one ``context`` it hands to its parts: its part in a partition handover is ``adoption``,
  withdrawing the items of jobs that end ``withdrawals``);
- ``view``: :class:`SchedulerView` (``Scheduler.view``), the frozen snapshots it returns and the
  ledger's books: how everything outside the core reads the scheduler, whose state is private;
- ``shares``: token shares between jobs (:class:`Shares`, :class:`JobPolicy`, :class:`ShareSettings`);
- ``endings``: jobs that end before their items are dispatched, cancelled or past their deadline, and
  the record of them (``Scheduler.end_job``, ``Scheduler.set_deadline``, ``Scheduler.take_ended``);
- ``retries``: which failed items go back to the lanes for another attempt (:class:`RetryPolicy`,
  ``Scheduler.set_max_attempts``, ``Scheduler.take_retried``);
- ``accounting``: the :class:`Ledger` of items and tokens at each stage, its books and
  :class:`LedgerImbalance` (its checks in ``ledger_checks``, its checkpoint in ``ledger_checkpoint``);
  ``measures``: :func:`padding_waste` and ``budget_fill``, the formulas every report uses.

Everything else in these modules (the lane table, consumer state, the in-flight table) is internal:
it may change in any release.
"""

from processor.core.accounting import ConsumerBook, JobBook, Ledger, LedgerImbalance, ModelBook, Tally
from processor.core.contract import BatchRule, Contract, InvariantViolation
from processor.core.dispatch import DispatchSettings
from processor.core.item import Batch, Item, ItemOutcome
from processor.core.lanes import LaneSettings
from processor.core.measures import padding_waste
from processor.core.retries import RetryPolicy
from processor.core.scheduler import Scheduler
from processor.core.shares import JobPolicy, Shares, ShareSettings
from processor.core.signature import shape_signature
from processor.core.view import ConsumerSnapshot, LaneSnapshot, SchedulerView, Waiting

__all__ = [
    "Batch",
    "BatchRule",
    "ConsumerBook",
    "ConsumerSnapshot",
    "Contract",
    "DispatchSettings",
    "InvariantViolation",
    "Item",
    "ItemOutcome",
    "JobBook",
    "JobPolicy",
    "LaneSettings",
    "LaneSnapshot",
    "Ledger",
    "LedgerImbalance",
    "ModelBook",
    "RetryPolicy",
    "Scheduler",
    "SchedulerView",
    "ShareSettings",
    "Shares",
    "Tally",
    "Waiting",
    "padding_waste",
    "shape_signature",
]
