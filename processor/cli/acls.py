"""``tokenfabric acls``: print (or ``--create``) exactly the ACLs each role of one pipeline needs.

The list comes from :func:`processor.kafka.acls.role_acls`, which derives every name from the
pipeline's topic prefix; docs/operations.md ("ACLs") is checked against it.
"""

from __future__ import annotations

import argparse
import sys

from processor.cli.options import add_kafka_arguments, kafka_settings
from processor.kafka.acls import ROLES, acls_for, create_acls, distinct, render
from processor.kafka.config import ConfigError
from processor.kafka.topics import TopicNames

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
    p.add_argument(
        "--create",
        action="store_true",
        help="create the ACLs through the Admin API (the connecting user needs Alter on the cluster)",
    )
    add_kafka_arguments(p)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from processor.kafka.exits import EXIT_REFUSED, refusal

    if not args.principal or ":" not in args.principal:
        print(f"{PROG}: error: --principal {args.principal or ''!r}: give it as User:NAME", file=sys.stderr)
        return 2
    by_role = acls_for(
        args.role or ROLES, TopicNames(args.topic_prefix), group=args.group, consumers=args.consumer
    )
    print(render(by_role, args.principal), end="")
    if not args.create:
        return 0
    try:
        conf, _ = kafka_settings(args, reach=True)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    from processor.kafka.factory import KAFKA

    acls = distinct(a for acls in by_role.values() for a in acls)
    try:
        created = create_acls(KAFKA.admin(conf), acls, args.principal)
    except KafkaException as exc:
        refused = refusal(exc, conf, operation="Alter", resource="the cluster (create ACLs)")
        if refused is not None:
            print(f"{PROG}: {refused}", file=sys.stderr)
            return EXIT_REFUSED
        print(f"{PROG}: error: creating ACLs on {conf['bootstrap.servers']}: {exc}", file=sys.stderr)
        return 1
    print(f"created {created} ACLs for {args.principal}")
    return 0
