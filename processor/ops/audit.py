"""Re-derive the ledger from the topics alone and compare it with what the processors checkpointed.

The processor's ledger is a claim; the topics are the evidence. The audit reads ingest, every batch
topic, results, dead letters and the changelog from the beginning (``read_committed``), counts
items and tokens at each stage by item id, and reports:

* duplicates: an item in two committed batches, or completed twice (must be 0);
* producer repeats: ingest messages that repeat an ``item_id`` the processor had already taken and
  dead-lettered as ``duplicate-item-id``, named by id. They are not failures: the audit counts them
  apart from received (as the ledger does, under ``duplicate``) and checks that each one's id was
  taken once (otherwise the item is lost);
* lost: an item received that is neither in a batch, nor waiting in the changelog, nor answered
  ``cancelled`` or ``expired`` by a processor (its job ended before it was dispatched) (must be 0);
* retried: failed completions marked ``retriable`` that a later completion of the same item, from
  another batch, follows (its next attempt: processor/core/retries.py); the item's result is its
  last completion by ``(attempt, order read)``, and its extra dispatches are not duplicates;
* cancelled and expired: the items so answered, which the ledger counts apart (``ENDINGS``), and any
  of them also in a batch (a processor dispatched an item of a job it had ended: must be 0);
* how the completed prompts were served: each item's result's ``cached_tokens`` (held to
  its prompt by ``prompt_split``) from the engine's prefix cache, the rest computed;
* every difference between the derived figures and the latest checkpoint of each processor (the
  prompt counters only when every checkpoint has them: a processor of an earlier version, or one
  that was given no cached counts, claims nothing about the cache).

Meant for a quiet pipeline (after a job, or with producers paused): items moving while it reads show
up as differences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from processor.core.accounting import ENDINGS, cached_prompt_share, prompt_split
from processor.kafka.factory import KAFKA
from processor.kafka.reader import position, read_topic
from processor.kafka.topics import TopicNames
from processor.ops.status import StatusView, gather
from processor.state import changelog
from processor.wire.completions import decode_completions
from processor.wire.control import DUPLICATE_ITEM_ID, decode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.heads import decode_batch_head
from processor.wire.items import decode_token_item
from processor.wire.records import CompletionRecord
from processor.wire.registry_framing import RegistryFraming, is_registry_framed


@dataclass(slots=True)
class AuditReport:
    received_items: int = 0
    received_tokens: int = 0
    dead_lettered: int = 0
    undecodable_ingest: int = 0
    dispatched_items: int = 0
    dispatched_tokens: int = 0
    completed_items: int = 0
    completed_tokens: int = 0
    failed_items: int = 0
    failed_tokens: int = 0
    cancelled_items: int = 0
    cancelled_tokens: int = 0
    expired_items: int = 0
    expired_tokens: int = 0
    retried_items: int = 0
    retried_tokens: int = 0
    ended_dispatched: int = 0
    """Items answered cancelled or expired that are also in a committed batch (must be 0)."""
    waiting_items: int = 0
    waiting_tokens: int = 0
    duplicate_dispatches: int = 0
    duplicate_completions: int = 0
    redelivered: int = 0
    lost_items: int = 0
    repeats: list[tuple[str, int, int]] = field(default_factory=list)
    """Producer repeats dead-lettered as duplicates: (item_id, ingest partition, offset)."""
    repeat_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens of completed items their engine served from its prefix cache, as reported."""
    prefill_tokens: int = 0
    """Prompt tokens of completed items their engine computed: completed_tokens - cached_prompt_tokens."""
    prompts_compared: bool = False
    """The checkpoints claim prompt counters, and they were compared."""
    differences: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            not self.differences
            and self.duplicate_dispatches == self.redelivered + self.retried_items
            and self.duplicate_completions == 0
            and self.lost_items == 0
            and self.ended_dispatched == 0
        )

    def lines(self) -> list[str]:
        share = cached_prompt_share(self.cached_prompt_tokens, self.prefill_tokens)
        out = [
            f"received      {self.received_items:>12,} items {self.received_tokens:>16,} tokens",
            f"dispatched    {self.dispatched_items:>12,} items {self.dispatched_tokens:>16,} tokens",
            f"completed     {self.completed_items:>12,} items {self.completed_tokens:>16,} tokens",
            f"failed        {self.failed_items:>12,} items {self.failed_tokens:>16,} tokens",
            f"cancelled     {self.cancelled_items:>12,} items {self.cancelled_tokens:>16,} tokens",
            f"expired       {self.expired_items:>12,} items {self.expired_tokens:>16,} tokens "
            f"({self.ended_dispatched:,} cancelled or expired and dispatched too)",
            f"waiting       {self.waiting_items:>12,} items {self.waiting_tokens:>16,} tokens",
            f"dead-lettered {self.dead_lettered:>12,} messages "
            f"({self.undecodable_ingest:,} undecodable in ingest)",
            f"retried       {self.retried_items:>12,} items {self.retried_tokens:>16,} tokens",
            f"duplicates    {self.duplicate_dispatches:>12,} dispatches ({self.redelivered:,} redelivered, "
            f"{self.retried_items:,} retried), "
            f"{self.duplicate_completions:,} completions",
            f"lost          {self.lost_items:>12,} items",
            f"prompts       {self.cached_prompt_tokens:>12,} cached {self.prefill_tokens:>15,} computed "
            f"({'-' if share is None else f'{share:.1%}'} cached"
            f"{'' if self.prompts_compared else '; no checkpoint counts them'})",
            f"repeats       {len(self.repeats):>12,} items {self.repeat_tokens:>16,} tokens "
            "(a producer sent an item_id again: dead-lettered as duplicate-item-id, not run)",
        ]
        shown = self.repeats[:REPEATS_SHOWN]
        out += [f"producer repeat: item_id {i!r} at partition {p} offset {o}" for i, p, o in shown]
        if len(self.repeats) > len(shown):
            out.append(f"producer repeat: ... and {len(self.repeats) - len(shown):,} more")
        out += [f"DIFFERENCE: {d}" for d in self.differences]
        out.append("audit clean" if self.clean else "AUDIT FAILED")
        return out


REPEATS_SHOWN = 50
"""Producer repeats named one per line in the report; the rest are counted."""


def batch_topics(conf: Mapping[str, str], topics: TopicNames) -> list[str]:
    prefix = topics.batches("")
    names = KAFKA.admin(conf).list_topics(timeout=30).topics
    return sorted(name for name in names if name.startswith(prefix))


def audit(
    conf: Mapping[str, str],
    topics: TopicNames,
    group: str = "",
    progress: Callable[[str], None] | None = None,
    framing: RegistryFraming | None = None,
) -> AuditReport:
    """``progress`` is told the name of each topic as the audit starts reading it; ``framing`` reads
    registry-framed ingest messages (processor/wire/registry_framing.py) as the processor does."""
    say = progress or (lambda _topic: None)
    r = AuditReport()
    received: dict[tuple[int, int], tuple[str, int]] = {}  # (partition, offset) -> (item_id, tokens)
    say(topics.ingest)
    for msg in read_topic(conf, topics.ingest):
        try:
            value = msg.value()
            if framing is not None and is_registry_framed(value):
                value = framing.single_object(value)
            rec = decode_token_item(value)
        except DecodeError:
            r.undecodable_ingest += 1
            continue
        received[position(msg)] = (rec.item_id, rec.token_count)
    say(topics.dead_letter)
    for msg in read_topic(conf, topics.dead_letter):
        r.dead_lettered += 1
        try:
            dead = decode_dead_letter(msg.value())
        except DecodeError:
            continue  # counted; not one of the processor's, so not a repeat
        if dead.reason != DUPLICATE_ITEM_ID or dead.source_topic != topics.ingest:
            continue
        repeat = received.pop((dead.partition, dead.offset), None)
        if repeat is not None:
            r.repeats.append((repeat[0], dead.partition, dead.offset))
            r.repeat_tokens += repeat[1]
    tokens: dict[str, int] = {}
    by_position: dict[tuple[int, int], str] = {}
    for ref, (item_id, count) in received.items():
        tokens[item_id] = count
        by_position[ref] = item_id
        r.received_items += 1
        r.received_tokens += count

    dispatched: Counter[str] = Counter()
    for topic in batch_topics(conf, topics):
        say(topic)
        for msg in read_topic(conf, topic):
            dispatched.update(it.item_id for it in decode_batch_head(msg.value()).items)
    r.dispatched_items = len(dispatched)
    r.dispatched_tokens = sum(tokens.get(i, 0) for i in dispatched)
    r.duplicate_dispatches = sum(n - 1 for n in dispatched.values())

    ended: set[str] = set()
    say(topics.results)
    read = (c for msg in read_topic(conf, topics.results) for c in decode_completions(msg.value()))
    for done in _last_completions(r, read):
        if done.status == "ok":
            r.completed_items += 1
            r.completed_tokens += done.input_tokens
            cached, computed = prompt_split(done.input_tokens, done.cached_tokens)
            r.cached_prompt_tokens += cached
            r.prefill_tokens += computed
        elif done.status in ENDINGS:
            ended.add(done.item_id)
            setattr(r, f"{done.status}_items", getattr(r, f"{done.status}_items") + 1)
            setattr(r, f"{done.status}_tokens", getattr(r, f"{done.status}_tokens") + done.input_tokens)
        else:
            r.failed_items += 1
            r.failed_tokens += done.input_tokens

    state = changelog.ChangelogState()
    say(topics.changelog)
    for msg in read_topic(conf, topics.changelog):
        state.apply(msg.key(), msg.value(), msg.partition())
    waiting = {by_position[ref] for ref in state.waiting if ref in by_position}
    r.waiting_items = len(waiting)
    r.waiting_tokens = sum(tokens[i] for i in waiting)
    r.lost_items = sum(1 for i in tokens if i not in dispatched and i not in waiting and i not in ended)
    r.ended_dispatched = sum(1 for i in ended if i in dispatched)
    r.lost_items += sum(1 for i, _p, _o in r.repeats if i not in tokens)  # a "repeat" of nothing taken
    _compare(r, gather(conf, topics, group))
    return r


def _compare(r: AuditReport, view: StatusView) -> None:
    total = view.total
    if not view.checkpoints:
        r.differences.append("no processor has checkpointed a ledger")
        return
    # An item whose consumer retired goes out again in a second batch; the ledger counts those.
    r.redelivered = sum(view.consumer_total(c, "redelivered_items") for c in view.owners("consumer"))
    pairs = [
        ("received_items", r.received_items),
        ("received_tokens", r.received_tokens),
        ("routed_items", r.dispatched_items + r.retried_items),  # a retry is dispatched again
        ("routed_tokens", r.dispatched_tokens + r.retried_tokens),
        ("completed_items", r.completed_items),
        ("completed_tokens", r.completed_tokens),
        ("failed_items", r.failed_items),
        ("failed_tokens", r.failed_tokens),
        ("cancelled_items", r.cancelled_items),
        ("cancelled_tokens", r.cancelled_tokens),
        ("expired_items", r.expired_items),
        ("expired_tokens", r.expired_tokens),
        ("retried_items", r.retried_items),
        ("retried_tokens", r.retried_tokens),
        ("queued_items", r.waiting_items),
        ("queued_tokens", r.waiting_tokens),
        ("dead_lettered_items", r.dead_lettered),
        ("duplicate_items", len(r.repeats)),
        ("duplicate_tokens", r.repeat_tokens),
    ]
    r.prompts_compared = all("prefill_tokens" in cp.counters for cp in view.checkpoints.values())
    if r.prompts_compared:
        pairs += [("cached_prompt_tokens", r.cached_prompt_tokens), ("prefill_tokens", r.prefill_tokens)]
    for key, derived in pairs:
        claimed = view.held(key) if key.startswith("queued_") else total(key)
        if claimed != derived:
            r.differences.append(f"{key}: checkpoint says {claimed:,}, topics say {derived:,}")


def _last_completions(r: AuditReport, completions: Iterable[CompletionRecord]) -> list[CompletionRecord]:
    """Each item's result: its last completion by ``(attempt, order read)``, a retriable failure
    first among those of one attempt (its retry was sent after it; a consumer that does not know
    attempts writes 1 for all, and results partitions are read in any order). A failed, ``retriable``
    completion that a completion of the item from another batch follows counts in ``r`` as retried;
    any other further completion as a duplicate."""
    by_item: dict[str, list[tuple[int, bool, int, CompletionRecord]]] = {}
    for n, c in enumerate(completions):
        retry = c.status == "failed" and c.retriable
        by_item.setdefault(c.item_id, []).append((c.attempt, not retry, n, c))
    out: list[CompletionRecord] = []
    for answers in by_item.values():
        answers.sort(key=lambda a: a[:3])
        held = answers[0][3]
        for _attempt, _retry, _n, c in answers[1:]:
            if held.status == "failed" and held.retriable and c.batch_id != held.batch_id:
                r.retried_items += 1
                r.retried_tokens += held.input_tokens
                held = c
            else:
                r.duplicate_completions += 1
        out.append(held)
    return out
