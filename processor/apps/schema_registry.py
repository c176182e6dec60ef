"""A small client of the Confluent Schema Registry API (any server that speaks it: Confluent's,
Apicurio's ``/apis/ccompat/v7``), over ``urllib``: the processor asks it for writer schemas by id,
``schemas register`` registers ours.

Settings come from the Kafka client's settings file and environment under the ``schema.registry.``
keys confluent-kafka uses (``schema.registry.url``, ``schema.registry.basic.auth.user.info``,
``schema.registry.ssl.ca.location``, ``schema.registry.ssl.certificate.location``,
``schema.registry.ssl.key.location``): processor/kafka/config.py keeps them out of the librdkafka
settings, which would refuse them, and :func:`~processor.kafka.config.registry_config` hands them
here. Invariant: a registry that does not answer (refused, timed out, a 5xx) raises
:class:`~processor.wire.registry_framing.RegistryUnavailable`, never a ``DecodeError``: an outage
is not bad input. After a failure the client does not ask again for ``retry_s``, so a held ingest
partition does not hammer a registry that is down.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from processor.kafka.config import ConfigError
from processor.kafka.topics import TopicNames
from processor.wire.registry_framing import RegistryUnavailable
from processor.wire.schemas import CANONICAL_FORMS

_KEYS = ("url", "basic.auth.user.info", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location")


@dataclass(frozen=True)
class RegistrySettings:
    url: str
    user_info: str = ""
    """``user:password`` for HTTP basic auth ("" for none)."""
    ca_location: str = ""
    cert_location: str = ""
    key_location: str = ""

    @classmethod
    def from_conf(cls, registry: Mapping[str, str]) -> RegistrySettings:
        """From :func:`~processor.kafka.config.registry_config`'s keys; ConfigError on a wrong one."""
        unknown = sorted(set(registry) - set(_KEYS))
        if unknown:
            raise ConfigError(
                f"schema.registry.{unknown[0]}: not a schema registry setting (known: {', '.join(_KEYS)})"
            )
        url = registry.get("url", "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--registry / schema.registry.url {url!r}: expected http://HOST:PORT/... or https://..."
            )
        return cls(
            url,
            registry.get("basic.auth.user.info", ""),
            registry.get("ssl.ca.location", ""),
            registry.get("ssl.certificate.location", ""),
            registry.get("ssl.key.location", ""),
        )


class RegistryRefused(Exception):
    """The registry answered with a client error (4xx other than an unknown id): its status and body."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class RegistryClient:
    """Confluent Schema Registry calls; writer schemas by id are cached (an id's schema never changes)."""

    def __init__(
        self, settings: RegistrySettings, timeout_s: float = 5.0, retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._clock = clock
        self._cache: dict[int, str] = {}
        self._down_until = 0.0
        self._lock = threading.Lock()
        self.down_since: float | None = None
        """When the registry stopped answering (None while it answers): health reads it."""
        self.lookups = 0
        """HTTP lookups of a schema by id (each id once while cached)."""
        self._context = _ssl_context(settings)

    def schema_text(self, schema_id: int) -> str | None:
        """The schema registered under ``schema_id``, None if the registry does not know it."""
        cached = self._cache.get(schema_id)
        if cached is not None:
            return cached
        with self._lock:
            if self._clock() < self._down_until:
                raise RegistryUnavailable(f"schema registry {self.settings.url} is not answering")
            self.lookups += 1
            try:
                body = self._call("GET", f"/schemas/ids/{schema_id}")
            except RegistryRefused as exc:
                if exc.status == 404:
                    return None
                raise RegistryUnavailable(f"schema registry {self.settings.url}: {exc}") from None
            text = str(body["schema"]) if body.get("schemaType", "AVRO") == "AVRO" else ""
            self._cache[schema_id] = text
            return text

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` (Avro JSON) under ``subject``; its id (the same id if already there)."""
        body = self._call("POST", f"/subjects/{_quote(subject)}/versions", {"schema": schema})
        return int(body["id"])

    def set_compatibility(self, subject: str, level: str) -> None:
        self._call("PUT", f"/config/{_quote(subject)}", {"compatibility": level})

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.settings.url + path, data=data, method=method)
        req.add_header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
        if data is not None:
            req.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        if self.settings.user_info:
            req.add_header(
                "Authorization", "Basic " + base64.b64encode(self.settings.user_info.encode()).decode()
            )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._context) as resp:
                answer = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise RegistryRefused(exc.code, exc.read().decode(errors="replace")) from None
            self._failed()
            raise RegistryUnavailable(f"schema registry {self.settings.url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._failed()
            raise RegistryUnavailable(
                f"schema registry {self.settings.url} is not answering: {exc}"
            ) from None
        self.down_since = None
        return answer

    def _failed(self) -> None:
        now = self._clock()
        self._down_until = now + self.retry_s
        if self.down_since is None:
            self.down_since = now


def subjects(topics: TopicNames) -> dict[str, str]:
    """Subject -> record name, by the topic-name strategy."""
    return {
        f"{topics.ingest}-value": "TokenItem",
        f"{topics.results}-value": "CompletionBatch",
        f"{topics.dead_letter}-value": "DeadLetter",
    }


def register_schemas(settings: RegistrySettings, topics: TopicNames, compatibility: str) -> dict[str, int]:
    """Register each subject's schema and set its rule; subject -> schema id. Raises
    RegistryUnavailable or RegistryRefused (an incompatible schema: HTTP 409)."""
    client = RegistryClient(settings)
    ids: dict[str, int] = {}
    for subject, record in subjects(topics).items():
        client.set_compatibility(subject, compatibility)
        ids[subject] = client.register(subject, CANONICAL_FORMS[record])
    return ids


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _ssl_context(settings: RegistrySettings) -> ssl.SSLContext | None:
    if not settings.url.startswith("https://"):
        return None
    context = ssl.create_default_context(cafile=settings.ca_location or None)
    if settings.cert_location:
        context.load_cert_chain(settings.cert_location, settings.key_location or None)
    return context
