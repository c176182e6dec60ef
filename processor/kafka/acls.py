"""The ACLs each role of one pipeline needs, derived from the names the pipeline uses (:mod:`.topics`).

Why as code: docs/operations.md used to list the ACLs by hand, and no test had run tokenfabric on a
broker that enforces them. :func:`role_acls` is now the list: ``tokenfabric acls`` prints it and, with
``--create``, creates it through the Admin API; tests/broker/test_acls.py runs a whole pipeline under
principals holding only these ACLs (sufficient) and removes each one in turn to see the role that
needs it refused (necessary); tests/kafka/test_acls.py checks docs/operations.md against it.

Invariants:

* every resource named here comes from :class:`~processor.kafka.topics.TopicNames` (topics, the
  processors' group, a consumer's group and transactional id) or from
  ``transactional_id_prefix(group)``, so one pipeline's ACLs never name another's resources;
* an ACL is listed only if some operation of its role fails without it (one ACL per (resource,
  operation); Kafka implies Describe from Read and Write, so Describe is listed only where nothing
  more is needed);
* throwaway readers (``<prefix>-reader-*``, ``<prefix>-collect-*``: processor.kafka.reader,
  processor.jobs.collect) are assigned partitions, never join their group and never commit, but
  librdkafka still looks up their group's coordinator, which needs Describe on the group: one
  prefixed ACL each, inside the pipeline's prefix, so no pipeline can describe another's readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from processor.kafka.topics import TopicNames

Resource = Literal["topic", "group", "transactional-id"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["Read", "Write", "Describe", "Create"]

ROLES = ("topics", "processor", "consumer", "producer", "submit", "collect", "jobs", "status", "audit")
"""Every role, in the order a deployment needs them."""


@dataclass(frozen=True, order=True)
class Acl:
    """Allow ``operation`` on one resource (a name, or every name starting with it when prefixed)."""

    resource: Resource
    name: str
    pattern: Pattern
    operation: Operation
    why: str = field(default="", compare=False)

    def line(self, principal: str) -> str:
        """One row of ``tokenfabric acls``: ``ALLOW User:x Read topic p.ingest literal  # why``."""
        return (
            f"ALLOW {principal} {self.operation:<8} {self.resource:<16} {self.name:<36} "
            f"{self.pattern:<8}  # {self.why}"
        )


def transactional_id_prefix(group: str) -> str:
    """A processor instance's transactional id is ``<group>-<instance>`` (processor.state.restore)."""
    return f"{group}-"


def _topic(name: str, operation: Operation, why: str, pattern: Pattern = "literal") -> Acl:
    return Acl("topic", name, pattern, operation, why)


def role_acls(
    role: str,
    names: TopicNames,
    *,
    group: str | None = None,
    consumers: Sequence[str] = (),
) -> list[Acl]:
    """The ACLs ``role`` (one of :data:`ROLES`) needs on the pipeline ``names``.

    ``group`` is the processors' ``--group`` (default ``<prefix>-processor``); ``consumers`` the
    consumer ids a ``consumer`` role covers (none: every consumer of the pipeline, by prefix).
    """
    g = group or names.processor_group
    batches_prefix = names.batches("")
    if role == "topics":
        return [_topic(f"{names.prefix}.", "Create", "create the pipeline's topics", "prefixed")]
    if role == "processor":
        return [
            _topic(names.ingest, "Read", "consume items; restore reads the heads of in-flight items"),
            _topic(names.contracts, "Read", "consumers' contracts"),
            _topic(names.job_shares, "Read", "job weights and quotas"),
            _topic(names.results, "Read", "completions free slots"),
            _topic(names.changelog, "Read", "restore lane state on assignment"),
            _topic(names.changelog, "Write", "lane state, in each transaction"),
            _topic(names.accounting, "Read", "its last ledger checkpoint, at start"),
            _topic(names.accounting, "Write", "ledger checkpoints"),
            _topic(batches_prefix, "Write", "batches to every consumer", "prefixed"),
            _topic(names.dead_letter, "Write", "items it cannot schedule"),
            Acl("group", g, "literal", "Read", "the ingest group: join, commit offsets in transactions"),
            Acl("group", f"{g}-control-", "prefixed", "Read", "each instance's results reader commits"),
            Acl("transactional-id", transactional_id_prefix(g), "prefixed", "Write", "<group>-<instance>"),
            _readers(names),
        ]
    if role == "consumer":
        out: list[Acl] = []
        ids: Iterable[str | None] = consumers or [None]
        for c in ids:
            own = names.consumer_group(c) if c is not None else names.consumer_group("")
            pattern: Pattern = "literal" if c is not None else "prefixed"
            out += [
                _topic(names.batches(c) if c is not None else batches_prefix, "Read", "its batches", pattern),
                Acl("group", own, pattern, "Read", "its group on the batch topic"),
                Acl("transactional-id", own, pattern, "Write", "completions and offsets in one transaction"),
            ]
        return [
            *out,
            _topic(names.results, "Write", "completions"),
            _topic(names.contracts, "Write", "announce its contract; --retire writes a tombstone"),
            _topic(names.dead_letter, "Write", "batches it cannot decode"),
        ]
    if role == "producer":
        return [_topic(names.ingest, "Write", "items (tokenfabric produce, or your producers)")]
    if role == "submit":
        return [
            _topic(names.ingest, "Write", "the job's items"),
            _topic(names.jobs, "Read", "refuse a job name already used"),
            _topic(names.jobs, "Write", "the job record"),
            _topic(names.contracts, "Read", "warn when no consumer serves the model"),
            _readers(names),
        ]
    if role == "collect":
        return [
            _topic(names.results, "Read", "the job's completions"),
            _topic(names.jobs, "Read", "the job record"),
            _topic(names.jobs, "Write", "progress, and finished"),
            _readers(names),
            Acl(
                "group",
                collect_group_prefix(names),
                "prefixed",
                "Describe",
                "its results reader's coordinator",
            ),
        ]
    if role == "jobs":
        return [
            _topic(names.jobs, "Read", "the jobs"),
            _topic(names.job_shares, "Read", "their weights and quotas"),
            *_ledger_reads(names, g),
        ]
    if role == "status":
        return [
            *_ledger_reads(names, g),
            _topic(batches_prefix, "Read", "count each consumer's unread batches", "prefixed"),
            Acl("group", names.consumer_group(""), "prefixed", "Describe", "consumers' members and offsets"),
        ]
    if role == "audit":
        return [
            _topic(names.ingest, "Read", "every item received"),
            _topic(batches_prefix, "Read", "every batch dispatched", "prefixed"),
            _topic(names.results, "Read", "every completion"),
            _topic(names.dead_letter, "Read", "every dead letter"),
            _topic(names.changelog, "Read", "what still waits"),
            _topic(names.contracts, "Read", "the consumers"),
            _topic(names.accounting, "Read", "the processors' ledgers"),
            Acl("group", g, "literal", "Describe", "the processors' committed offsets"),
            _readers(names),
        ]
    raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")


def reader_group_prefix(names: TopicNames) -> str:
    """The throwaway readers' group ids start with this (processor.kafka.reader.reader_group)."""
    return f"{names.prefix}-reader-"


def collect_group_prefix(names: TopicNames) -> str:
    """``collect``'s results reader's group ids start with this (processor.jobs.collect)."""
    return f"{names.prefix}-collect-"


def _readers(names: TopicNames) -> Acl:
    return Acl("group", reader_group_prefix(names), "prefixed", "Describe", "throwaway readers' coordinator")


def _ledger_reads(names: TopicNames, group: str) -> list[Acl]:
    """What :func:`processor.ops.status.gather` reads: contracts, checkpoints and the ingest lag."""
    return [
        _topic(names.contracts, "Read", "the consumers' contracts"),
        _topic(names.accounting, "Read", "every processor's checkpoint"),
        _topic(names.ingest, "Describe", "ingest end offsets (lag)"),
        Acl("group", group, "literal", "Describe", "the processors' committed offsets (lag)"),
        _readers(names),
    ]


def acls_for(
    roles: Iterable[str], names: TopicNames, *, group: str | None = None, consumers: Sequence[str] = ()
) -> dict[str, list[Acl]]:
    """role -> its ACLs, for each of ``roles`` (see :func:`role_acls`)."""
    return {role: role_acls(role, names, group=group, consumers=consumers) for role in roles}


def distinct(acls: Iterable[Acl]) -> list[Acl]:
    """Each (resource, name, pattern, operation) once, sorted: what one principal of several roles needs."""
    seen: dict[Acl, Acl] = {}
    for acl in acls:
        seen.setdefault(acl, acl)
    return sorted(seen)


def binding(acl: Acl, principal: str, host: str = "*", *, as_filter: bool = False) -> Any:
    """The ``confluent_kafka.admin.AclBinding`` that allows ``acl`` to ``principal`` (with
    ``as_filter``, the ``AclBindingFilter`` that matches exactly it, for deleting)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    resource = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactional-id": ResourceType.TRANSACTIONAL_ID,
    }[acl.resource]
    pattern = ResourcePatternType.LITERAL if acl.pattern == "literal" else ResourcePatternType.PREFIXED
    operation = AclOperation[acl.operation.upper()]
    kind = AclBindingFilter if as_filter else AclBinding
    return kind(resource, acl.name, pattern, principal, host, operation, AclPermissionType.ALLOW)


def create_acls(admin: Any, acls: Iterable[Acl], principal: str, timeout_s: float = 30.0) -> int:
    """Create ``acls`` for ``principal`` (existing ones are kept: Kafka's create is idempotent) and
    return once the broker enforces them. Returns how many were sent; raises the first refusal
    (``KafkaException``)."""
    wanted = distinct(acls)
    if not wanted:
        return 0
    bindings = [binding(a, principal) for a in wanted]
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    _wait_in_force(admin, principal, lambda held: set(wanted) <= held, timeout_s)
    return len(bindings)


def held_acls(admin: Any, principal: str, timeout_s: float = 30.0) -> set[Acl]:
    """The ALLOW ACLs the broker holds for ``principal`` on topics, groups and transactional ids."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kinds: dict[Any, Resource] = {
        ResourceType.TOPIC: "topic",
        ResourceType.GROUP: "group",
        ResourceType.TRANSACTIONAL_ID: "transactional-id",
    }
    # None matches any name and any host (confluent-kafka's documented filter; its stubs say str)
    any_name: Any = None
    query = AclBindingFilter(
        ResourceType.ANY, any_name, ResourcePatternType.ANY, principal, any_name, AclOperation.ANY,
        AclPermissionType.ALLOW,
    )  # fmt: skip
    out: set[Acl] = set()
    for b in admin.describe_acls(query, request_timeout=timeout_s).result(timeout=timeout_s):
        if b.restype in kinds:
            pattern: Pattern = (
                "prefixed" if b.resource_pattern_type == ResourcePatternType.PREFIXED else "literal"
            )
            out.add(Acl(kinds[b.restype], b.name, pattern, b.operation.name.capitalize()))
    return out


def _wait_in_force(admin: Any, principal: str, done: Callable[[set[Acl]], bool], timeout_s: float) -> None:
    """Wait until the broker answers with the ACLs ``done`` wants: a change reaches the authorizer
    through the metadata log a moment after the create or delete call returns (about 0.5 s here)."""
    deadline = time.monotonic() + timeout_s
    while not done(held_acls(admin, principal, timeout_s)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ACLs of {principal} not in force after {timeout_s:.0f} s")
        time.sleep(0.1)


def delete_acls(admin: Any, acls: Iterable[Acl], principal: str, timeout_s: float = 30.0) -> int:
    """Delete exactly these ACLs of ``principal``; returns how many the broker deleted."""
    filters = [binding(a, principal, as_filter=True) for a in distinct(acls)]
    if not filters:
        return 0
    deleted = 0
    for future in admin.delete_acls(filters, request_timeout=timeout_s).values():
        deleted += len(future.result(timeout=timeout_s))
    return deleted


def render(by_role: Mapping[str, Sequence[Acl]], principal: str) -> str:
    """The text ``tokenfabric acls`` prints: one block per role, one line per ACL."""
    blocks = []
    for role, acls in by_role.items():
        lines = [f"# {role}"] + [a.line(principal) for a in acls]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
