"""Which pipelines a cluster holds, and a clear refusal for a ``--topic-prefix`` that names none.

Why: a typo in ``--topic-prefix`` used to look like success (``jobs`` and ``status`` printed empty
tables and exited 0 on topics that do not exist). A pipeline exists when its ingest topic does
(``<prefix>.ingest``: ``topics create`` makes it first, and nothing else creates it), so the check
is one metadata request, and the refusal can name the prefixes that do exist.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from processor.kafka.config import ConfigError
from processor.kafka.factory import KAFKA, AdminClientLike, ClientFactory
from processor.kafka.topics import TopicNames, unisolated

INGEST_SUFFIX = ".ingest"


class NoSuchPipeline(ConfigError):
    """The cluster has no topics under the given prefix: a wrong ``--topic-prefix`` (exit 2)."""


def pipeline_prefixes(topic_names: Iterable[str]) -> list[str]:
    """The prefixes whose ingest topic is among ``topic_names``, sorted."""
    return sorted(
        t[: -len(INGEST_SUFFIX)]
        for t in topic_names
        if t.endswith(INGEST_SUFFIX) and len(t) > len(INGEST_SUFFIX)
    )


def check_pipeline(
    conf: Mapping[str, str],
    topics: TopicNames,
    clients: ClientFactory = KAFKA,
    timeout_s: float = 10.0,
    create: str = "",
) -> None:
    """Return if ``topics``' ingest topic exists; raise :class:`NoSuchPipeline` naming the prefixes
    that do exist (and how to create this one) if not. ``create`` is the command that makes a
    pipeline on the caller's path (default: ``tokenfabric topics create --topic-prefix P``)."""
    admin = clients.admin(conf)
    refusal = missing_pipeline(topics, admin.list_topics(timeout=timeout_s).topics, conf, create)
    if refusal is not None:
        raise_if_hidden(admin, topics.ingest, conf, timeout_s)
        raise refusal


def raise_if_hidden(admin: AdminClientLike, topic: str, conf: Mapping[str, str], timeout_s: float) -> None:
    """Raise :class:`~processor.kafka.exits.Refused` (exit 77) if ``topic`` is missing from the
    cluster's metadata because the authorizer hides it from this principal, not because it is not there.

    A metadata listing leaves out every topic the principal may not Describe, so "no such topic" and
    "no right to see it" look alike there; describing the topic by name tells them apart (Kafka
    answers TOPIC_AUTHORIZATION_FAILED, whether or not the topic exists, and never creates it).
    """
    from confluent_kafka import KafkaException, TopicCollection

    from processor.kafka.exits import refusal

    future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic]
    try:
        future.result(timeout=timeout_s)
    except TimeoutError:
        return  # no answer: the caller's own check says what is missing
    except KafkaException as exc:
        refused = refusal(exc, conf, operation="Describe", topic=topic)
        if refused is not None:
            raise refused from None


#: A prefix at least this similar (difflib's ratio) to one given is taken for what was meant.
CLOSE_RATIO = 0.75


def missing_pipeline(
    topics: TopicNames, topic_names: Iterable[str], conf: Mapping[str, str], create: str = ""
) -> NoSuchPipeline | None:
    """None if ``topics``' ingest topic is among ``topic_names`` (the cluster's), else the refusal.

    A prefix close to an existing one is taken for a typo: the refusal names the close ones and does
    not advise creating the misspelt pipeline; any other names how to create it (``create``)."""
    names = set(topic_names)
    if topics.ingest in names:
        return None
    found = pipeline_prefixes(names)
    where = conf.get("bootstrap.servers", "?")
    head = f"--topic-prefix {topics.prefix!r}: no pipeline on {where} (no topic {topics.ingest}"
    close = difflib.get_close_matches(topics.prefix, found, n=NAMED_PREFIXES, cutoff=CLOSE_RATIO)
    if close:
        return NoSuchPipeline(f"{head}); did you mean {' or '.join(close)}? (pass that --topic-prefix)")
    create = create or f"tokenfabric topics create --topic-prefix {topics.prefix}"
    return NoSuchPipeline(f"{head}; {_named(topics.prefix, found)}); to start a new one: '{create}'")


#: At most this many existing prefixes are named in a refusal: the nearest to the one given.
NAMED_PREFIXES = 5


def _named(prefix: str, found: list[str]) -> str:
    """The existing prefixes, or on a busy cluster the few nearest to ``prefix`` (a typo's fix)."""
    if not found:
        return "it holds no pipeline yet"
    if len(found) <= NAMED_PREFIXES:
        return f"prefixes there: {', '.join(found)}"
    nearest = difflib.get_close_matches(prefix, found, n=NAMED_PREFIXES, cutoff=0.0)
    return f"{len(found)} prefixes there, the nearest: {', '.join(nearest)}"


def refuse_new_nested_pipeline(
    conf: Mapping[str, str], topics: TopicNames, clients: ClientFactory = KAFKA, timeout_s: float = 10.0
) -> None:
    """Raise :class:`~processor.kafka.config.ConfigError` (exit 2) before a new pipeline is created
    under a prefix that is not isolated (processor.kafka.topics.unisolated); a pipeline that already
    exists under such a prefix keeps working (its names are unchanged)."""
    problem = unisolated(topics.prefix)
    if problem is None:
        return
    if topics.ingest in clients.admin(conf).list_topics(timeout=timeout_s).topics:
        return
    raise ConfigError(f"{problem} (pipelines already created under it keep working)")
