"""``tokenfabric acls``: print, ``--create`` or ``--delete`` exactly the ACLs each role of one pipeline
needs (``--dry-run``: say what would change, change nothing).

The list comes from :func:`processor.kafka.acls.role_acls`, which derives every name from the
pipeline's topic prefix; docs/operations.md ("ACLs") is checked against it. A prefix that is not
isolated (processor.kafka.topics.unisolated) is refused: its names could be covered by the prefixed
ACLs of another pipeline, or cover another's.
"""

from __future__ import annotations

import argparse
import sys

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.kafka.acls import ROLES, Acl, acls_for, create_acls, delete_acls, distinct, render
from processor.kafka.config import ConfigError
from processor.kafka.topics import TopicNames, unisolated

PROG = "tokenfabric acls"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--principal",
        metavar="User:NAME",
        help="the principal the ACLs allow (User:<SASL user> or User:<certificate CN>; required)",
    )
    p.add_argument(
        "--role",
        action="append",
        choices=ROLES,
        default=[],
        help="a role the principal plays (repeatable; default: every role)",
    )
    p.add_argument(
        "--consumer",
        action="append",
        default=[],
        metavar="ID",
        help="the consumer role covers only these consumer ids (repeatable; default: all, by prefix)",
    )
    p.add_argument(
        "--group",
        default=None,
        help="the processors' --group, if not <prefix>-processor",
    )
    action = p.add_mutually_exclusive_group()
    action.add_argument(
        "--create",
        action="store_true",
        help="create the ACLs through the Admin API (the connecting user needs Alter on the cluster)",
    )
    action.add_argument(
        "--delete",
        action="store_true",
        help="delete exactly these ACLs of the principal (others it holds are left alone)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --create or --delete: print what would change and connect to nothing",
    )
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not args.principal or ":" not in args.principal:
        print(f"{PROG}: error: --principal {args.principal or ''!r}: give it as User:NAME", file=sys.stderr)
        return 2
    names = TopicNames(args.topic_prefix)
    problem = unisolated(names.prefix) or _outside(args.group, names)
    if problem is not None:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    by_role = acls_for(args.role or ROLES, names, group=args.group, consumers=args.consumer)
    verb = "create" if args.create else "delete" if args.delete else None
    if verb is None:
        if args.dry_run:
            print(f"{PROG}: error: --dry-run goes with --create or --delete", file=sys.stderr)
            return 2
        print(render(by_role, args.principal), end="")
        return 0
    acls = distinct(a for acls in by_role.values() for a in acls)
    if args.dry_run:
        print(render(by_role, args.principal), end="")
        print(f"dry run: would {verb} {len(acls)} ACLs for {args.principal}; nothing changed")
        return 0
    print(render(by_role, args.principal), end="")
    return _apply(args, verb, acls)


def _outside(group: str | None, names: TopicNames) -> str | None:
    """Why a ``--group`` outside the pipeline's names cannot be granted, or None."""
    if group is None or group.startswith(f"{names.prefix}-"):
        return None
    return (
        f"--group {group!r}: a processors' group must start with '{names.prefix}-', so the pipeline's "
        f"prefixed ACLs cover it and no other pipeline's do"
    )


def _apply(args: argparse.Namespace, verb: str, acls: list[Acl]) -> int:
    """Create or delete ``acls`` for ``args.principal``; one line for a refusal (77)."""
    from confluent_kafka import KafkaException

    from processor.kafka.exits import EXIT_REFUSED, refusal
    from processor.kafka.factory import KAFKA

    try:
        conf, _ = kafka_settings(args, reach=True)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    act = create_acls if verb == "create" else delete_acls
    try:
        done = act(KAFKA.admin(conf), acls, args.principal)
    except KafkaException as exc:
        refused = refusal(exc, conf, operation="Alter", resource=f"the cluster ({verb} ACLs)")
        if refused is not None:
            print(f"{PROG}: {refused}", file=sys.stderr)
            return EXIT_REFUSED
        print(f"{PROG}: error: {verb} ACLs on {conf['bootstrap.servers']}: {exc}", file=sys.stderr)
        return 1
    print(f"{verb}d {done} ACLs for {args.principal}")
    return 0
