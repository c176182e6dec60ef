"""``tokenfabric schemas register``: put the project's Avro schemas in a Schema Registry under the
topic-name strategy, so that a team's registry serializers and deserializers find them.

Subjects (``<topic>-value``): ``<prefix>.ingest-value`` (TokenItem), ``<prefix>.results-value``
(CompletionBatch, what consumer apps write by default) and ``<prefix>.dead-letter-value``
(DeadLetter), each with a compatibility rule (``--compatibility``, default BACKWARD: a producer's
next schema must read what the last one wrote). The registry is the one the Kafka settings file names
(``schema.registry.url`` and the other ``schema.registry.`` keys, docs/schema-registry.md) unless
``--registry URL`` names another. ``topics create --registry URL`` and ``local up --registry`` call
:func:`~processor.apps.schema_registry.register_schemas`.
"""

from __future__ import annotations

import argparse
import sys

from processor.apps.schema_registry import (
    RegistryClient,
    RegistryRefused,
    RegistrySettings,
    register_schemas,
)
from processor.cli.options import add_kafka_arguments
from processor.kafka.config import ConfigError, registry_config
from processor.kafka.topics import TopicNames
from processor.wire.registry_framing import RegistryFraming, RegistryUnavailable
from processor.wire.schemas import CANONICAL_FORMS

COMPATIBILITY = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                 "FULL_TRANSITIVE", "NONE")  # fmt: skip


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["register"], help="register: put every schema under its subject")
    add_registry_argument(p)
    p.add_argument(
        "--compatibility", choices=COMPATIBILITY, default="BACKWARD",
        help="the compatibility rule set on each subject (default: %(default)s)",
    )  # fmt: skip
    add_kafka_arguments(p)


def add_registry_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry", metavar="URL", default=None,
        help="Confluent-compatible schema registry URL (default: schema.registry.url of --kafka-config)",
    )  # fmt: skip


def registry_settings(args: argparse.Namespace) -> RegistrySettings | None:
    """The registry the arguments name (``--registry``, else the settings file's); None for none."""
    conf = registry_config(getattr(args, "kafka_config", None))
    url = getattr(args, "registry", None)
    if url:
        conf["url"] = url
    return RegistrySettings.from_conf(conf) if conf.get("url") else None


def framing_from(args: argparse.Namespace) -> RegistryFraming | None:
    """The ingest's reader of registry-framed items, when a registry is configured."""
    settings = registry_settings(args)
    return None if settings is None else RegistryFraming(RegistryClient(settings))


RESULTS_FRAMINGS = ("single-object", "registry")


def add_results_framing_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results-framing", choices=RESULTS_FRAMINGS, default="single-object",
        help="how CompletionBatch messages are written to the results topic: single-object (ours) or "
        "registry (the Confluent wire format under <prefix>.results-value, for registry deserializers; "
        "needs a registry). Give every consumer and the processor of a pipeline the same "
        "(default: %(default)s)",
    )  # fmt: skip


def results_schema_id(args: argparse.Namespace) -> int | None:
    """With ``--results-framing registry``: our ``CompletionBatch``'s id under
    ``<prefix>.results-value`` (registered if it is not there yet, as registry serializers do); else
    None. ConfigError without a registry; RegistryUnavailable or RegistryRefused from the registry."""
    if args.results_framing != "registry":
        return None
    settings = registry_settings(args)
    if settings is None:
        raise ConfigError(
            "--results-framing registry needs a schema registry: pass --registry URL or set "
            "schema.registry.url in --kafka-config"
        )
    subject = f"{TopicNames(args.topic_prefix).results}-value"
    return RegistryClient(settings).register(subject, CANONICAL_FORMS["CompletionBatch"])


def print_registered(ids: dict[str, int], compatibility: str) -> None:
    for subject, schema_id in ids.items():
        print(f"registered {subject} id={schema_id} compatibility={compatibility}")


def run(args: argparse.Namespace) -> int:
    prog = "tokenfabric schemas register"
    try:
        settings = registry_settings(args)
        if settings is None:
            raise ConfigError(
                "no schema registry: pass --registry URL or set schema.registry.url in --kafka-config"
            )
        ids = register_schemas(settings, TopicNames(args.topic_prefix), args.compatibility)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except RegistryUnavailable as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 69
    except RegistryRefused as exc:
        print(f"{prog}: error: the registry refused: {exc}", file=sys.stderr)
        return 1
    print_registered(ids, args.compatibility)
    return 0
