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
from processor.kafka.factory import KAFKA, ClientFactory
from processor.kafka.topics import TopicNames

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
    listed = clients.admin(conf).list_topics(timeout=timeout_s).topics
    refusal = missing_pipeline(topics, listed, conf, create)
    if refusal is not None:
        raise refusal


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
