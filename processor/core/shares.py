"""Token shares between jobs: weighted fair sharing of a model's cards, in tokens, and quotas.

A platform shares one fleet between jobs. Each job has a :class:`JobPolicy`: a ``weight`` (default 1)
and optional quotas. Over any window in which several jobs of a model have items waiting, each is to
receive routed tokens in proportion to its weight.

**Virtual time.** Each (model, job) keeps a virtual time ``vtime``: the real tokens routed to it
divided by its weight. Serving the job with the least virtual time is weighted fair queuing in
tokens. A job that had nothing waiting and gets an item again starts at the least virtual time of
the model's jobs that are waiting (never below its own), so an idle job cannot bank credit and a
newcomer behind a backlog is at once the one most owed. *Lag* is a job's virtual time minus the
least of the waiting jobs' (``>= 0``).

**Slack, and why it is not zero.** A batch is one lane, a lane is one job (``core/lanes.py`` keys
lanes by model, shape and job), and a card is sticky to its shape: serving strictly the most owed
job would switch shapes on nearly every batch. The rule instead lets a card keep its job while the
job's lag is at most ``slack_tokens x (1 + k)``, where ``k`` counts the model's other cards that are
on jobs more owed than it. The first card leaves a job that ran ahead by ``slack_tokens``; a second
only once the gap doubles, and so on. With equal weights and as many jobs as cards, that settles on
one card per job with no further switches; with unequal weights the cards take turns in rounds of a
few ``slack_tokens``. Hence the tolerance: while two jobs both wait, ``vtime`` of any two differs by
at most ``slack_tokens x cards`` plus one batch, so over a window in which the model routes ``T``
tokens each job's share is within about ``slack_tokens x cards x sum(weights) / T`` of its weight's
fraction. docs/shares.md measures the cost in switches and cache hits.

**Quotas** cap a job (over all its models) in real routed tokens: ``max_tokens`` in total, and
``max_tokens_per_s`` as a token bucket holding at most ``max_tokens_per_s x burst_ms / 1000`` tokens
(or the job's longest item, if longer: else that item could never go). A batch from a lane whose
representative length is ``rep`` takes at most ``allowance // rep`` items, so a quota is never
exceeded: over any interval of ``d`` ms a job receives at most ``bucket + rate x d / 1000`` tokens,
and never more than ``max_tokens`` in all. A capped job's items wait; none is dropped. A requeued
batch gives its tokens back to ``max_tokens`` (the quota counts net routed tokens, as the ledger does).

Pure: the caller passes ``now_ms``; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from processor.core.accounting import Ledger
    from processor.core.lane import Lane
    from processor.core.lanes import ShapeLanes

DEFAULT_JOB = ""
"""The job of an item that names none."""


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """How much of the fleet a job gets: its weight, and optional caps in real routed tokens."""

    weight: float = 1.0
    """Share of a model's routed tokens while other jobs of the model wait, relative to theirs."""
    max_tokens_per_s: float | None = None
    """Most routed tokens per second, as a token bucket; None: no rate cap."""
    max_tokens: int | None = None
    """Most routed tokens in all; None: no total cap."""
    burst_ms: int = 10_000
    """The rate bucket holds this many milliseconds of ``max_tokens_per_s`` (at least one item)."""

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        if self.max_tokens_per_s is not None and not self.max_tokens_per_s > 0:
            raise ValueError(f"max_tokens_per_s must be > 0 or None, got {self.max_tokens_per_s}")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 or None, got {self.max_tokens}")
        if self.burst_ms < 1:
            raise ValueError(f"burst_ms must be >= 1, got {self.burst_ms}")

    @property
    def capped(self) -> bool:
        return self.max_tokens_per_s is not None or self.max_tokens is not None


@dataclass(frozen=True, slots=True)
class ShareSettings:
    slack_tokens: int = 65_536
    """How far (virtual tokens) a card's job may run ahead of the most owed job before the card
    leaves it; each other card already on a more owed job adds as much again (module docstring)."""

    max_jobs: int = 64
    """Most jobs with lanes, books and shares of their own; the items of any job past it (a producer
    that puts a session id in ``job_id``, say) count as job "" (no job). A job with a policy always
    has its own. Bounds the lanes a shape splits into and the per-job keys of a checkpoint."""

    def __post_init__(self) -> None:
        if self.slack_tokens < 0:
            raise ValueError(f"slack_tokens must be >= 0, got {self.slack_tokens}")
        if self.max_jobs < 0:
            raise ValueError(f"max_jobs must be >= 0, got {self.max_jobs}")


class JobQuota:
    """A job's rate bucket, and its longest item (the bucket holds at least that)."""

    __slots__ = ("bucket", "bucket_ms", "longest")

    def __init__(self) -> None:
        self.bucket = 0.0
        self.bucket_ms: int | None = None  # None: not used yet (it starts full)
        self.longest = 1  # the job's longest item so far: the bucket holds at least that


class Shares:
    """Virtual times of every (model, job) with work, job policies and quota state.

    The scheduler tells it when a job's lanes gain or lose their last waiting item
    (:meth:`lanes_changed`), what each batch routes (:meth:`routed`) and what comes back undone
    (:meth:`requeued`); dispatch asks :meth:`gate` for the model's state at this instant.
    """

    def __init__(self, settings: ShareSettings | None = None) -> None:
        self.settings = settings or ShareSettings()
        self.policies: dict[str, JobPolicy] = {}
        self.quotas: dict[str, JobQuota] = {}
        self.vtime: dict[str, dict[str, float]] = {}  # model -> job -> virtual time
        self._active: dict[str, dict[str, int]] = {}  # model -> job -> active (model, shape, job) lanes
        self.contended: set[str] = set()
        """Models with two jobs or more waiting: with no quota set, only these need a :class:`Gate`."""
        self.quota_count = 0  # policies with a quota: while 0 and one job waits, the gate is skipped
        self._tracked: set[str] = {DEFAULT_JOB}
        self.routed_tokens: dict[str, int] = {}  # per job, net of requeues: what max_tokens counts

    # -- policies ---------------------------------------------------------------------------------

    def set_policy(self, job: str, policy: JobPolicy) -> None:
        self._tracked.add(job)
        old = self.policies.get(job)
        self.quota_count += policy.capped - (old.capped if old is not None else False)
        if policy == JobPolicy():
            self.policies.pop(job, None)
        else:
            self.policies[job] = policy

    def policy(self, job: str) -> JobPolicy:
        return self.policies.get(job) or _DEFAULT

    def track(self, job: str) -> str:
        """The job an arriving item of ``job`` counts as: itself, or "" once ``max_jobs`` other
        jobs are tracked (see :attr:`ShareSettings.max_jobs`)."""
        if job in self._tracked:
            return job
        if len(self._tracked) - 1 < self.settings.max_jobs:  # named jobs; "" is always there
            self._tracked.add(job)
            return job
        return DEFAULT_JOB

    # -- events -----------------------------------------------------------------------------------

    def lanes_changed(self, model: str, job: str, delta: int) -> None:
        """``delta`` of the job's (model, shape) lane groups gained their first waiting item (+1) or
        lost their last (-1). A job that starts waiting again catches up to the waiting jobs."""
        active = self._active.setdefault(model, {})
        n = active.get(job, 0) + delta
        if n > 0:
            if n == delta:  # it was idle
                times = self.vtime.setdefault(model, {})
                floor = min((times.get(j, 0.0) for j in active if j != job), default=None)
                if floor is not None and times.get(job, 0.0) < floor:
                    times[job] = floor
            active[job] = n
        else:
            active.pop(job, None)
        if len(active) > 1:
            self.contended.add(model)
        else:
            self.contended.discard(model)

    def routed(self, model: str, job: str, tokens: int, now_ms: int) -> None:
        """A batch of ``job`` went out with ``tokens`` real tokens."""
        p = self.policies.get(job) if self.policies else None
        cost = tokens if p is None else tokens / p.weight
        try:  # the job has a virtual time and routed before (all but its first batch): no calls
            self.vtime[model][job] += cost
        except KeyError:
            self.vtime.setdefault(model, {})[job] = 0.0 + cost  # a float, as every virtual time
        try:
            self.routed_tokens[job] += tokens
        except KeyError:
            self.routed_tokens[job] = tokens
        if p is not None and p.max_tokens_per_s is not None:
            self._quota(job, now_ms).bucket -= tokens

    def requeued(self, job: str, tokens: int) -> None:
        self.routed_tokens[job] = self.routed_tokens.get(job, 0) - tokens

    def resume(self, ledger: Ledger) -> None:
        """Continue from a checkpointed ledger: each job's routed tokens count against ``max_tokens``
        again (what this instance routed; quotas are per instance, docs/shares.md)."""
        for job, book in ledger.jobs.items():
            self.routed_tokens[job] = book.routed.tokens

    def reset_waiting(self) -> None:
        """Every waiting item left (its partitions were handed over): nothing is active any more."""
        self._active.clear()
        self.contended.clear()

    # -- questions --------------------------------------------------------------------------------

    def gate(self, model: str, now_ms: int) -> Gate | None:
        """The model's share state for one dispatch decision; None when there is nothing to decide
        (at most one job waits and no job has a quota), which is the whole cost of shares then."""
        if not self.quota_count and model not in self.contended:
            return None
        return Gate(self, model, now_ms)

    def room(self, job: str, rep: int, now_ms: int) -> int | None:
        """How many items of a lane with representative length ``rep`` the job's quotas allow now;
        None: no quota. An item never exceeds its lane's ``rep``, so ``n x rep`` bounds the batch."""
        p = self.policy(job)
        if not p.capped:
            return None
        q = self._quota(job, now_ms)
        if rep > q.longest:  # lanes are one job's, so rep is one of its items' length
            q.longest = rep
            q = self._quota(job, now_ms)
        allowance = float("inf")
        if p.max_tokens is not None:
            allowance = p.max_tokens - self.routed_tokens.get(job, 0)
        if p.max_tokens_per_s is not None:
            allowance = min(allowance, q.bucket)
        return max(0, int(allowance // rep))

    def capped_now(self, job: str, now_ms: int) -> bool:
        """Whether the job's quota holds it back now (not even its longest item may go)."""
        room = self.room(job, self._quota(job, now_ms).longest, now_ms) if self.policy(job).capped else None
        return room == 0

    def _quota(self, job: str, now_ms: int) -> JobQuota:
        q = self.quotas.get(job)
        if q is None:
            q = self.quotas[job] = JobQuota()
        p = self.policy(job)
        rate = p.max_tokens_per_s
        if rate is not None:
            size = max(rate * p.burst_ms / 1000, q.longest)
            if q.bucket_ms is None:
                q.bucket, q.bucket_ms = size, now_ms
            elif now_ms > q.bucket_ms:
                q.bucket = min(size, q.bucket + rate * (now_ms - q.bucket_ms) / 1000)
                q.bucket_ms = now_ms
        return q

    def jobs(self) -> Iterable[str]:
        """Every job with a policy, a quota state or a virtual time."""
        seen = dict.fromkeys(self.policies)
        seen.update(dict.fromkeys(self.routed_tokens))
        for times in self.vtime.values():
            seen.update(dict.fromkeys(times))
        return seen


_DEFAULT = JobPolicy()


class Gate:
    """One dispatch decision's view of a model's jobs: who is owed, who may be kept, who is capped."""

    __slots__ = ("floor", "model", "now_ms", "shares", "times")

    def __init__(self, shares: Shares, model: str, now_ms: int) -> None:
        self.shares = shares
        self.model = model
        self.now_ms = now_ms
        self.times = shares.vtime.setdefault(model, {})
        waiting = shares._active.get(model, {})
        self.floor = min(
            (self.times.get(j, 0.0) for j in waiting if not shares.capped_now(j, now_ms)), default=0.0
        )

    def vtime(self, job: str) -> float:
        return self.times.get(job, 0.0)

    def lag(self, job: str) -> float:
        return max(0.0, self.times.get(job, 0.0) - self.floor)

    def room(self, sl: ShapeLanes, lane: Lane) -> int | None:
        """How many items a batch from ``lane`` (of ``sl``'s job) may take; None: no quota."""
        return self.shares.room(sl.job, lane.rep, self.now_ms)

    def allows(self, sl: ShapeLanes, lane: Lane) -> bool:
        room = self.shares.room(sl.job, lane.rep, self.now_ms)
        return room is None or room > 0

    def admits(self, job: str) -> bool:
        """Whether the job is within ``slack_tokens`` of the most owed job (the deadline's test)."""
        return self.lag(job) <= self.shares.settings.slack_tokens

    def keeps(self, job: str, ahead: int) -> bool:
        """Whether a card on ``job`` stays on it, ``ahead`` other cards being on more owed jobs."""
        return self.lag(job) <= self.shares.settings.slack_tokens * (1 + ahead)

    def order(self, jobs: Iterable[str]) -> list[str]:
        """``jobs`` most owed first (quotas are asked lane by lane: :meth:`allows`)."""
        return sorted(jobs, key=self.vtime)
