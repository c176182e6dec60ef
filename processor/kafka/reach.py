"""Can the cluster be reached? One quiet probe before a short command starts its real clients.

Why: a command run against a broker that is not there (a typo in ``--bootstrap``, a cluster behind a
firewall, wrong TLS or SASL settings) used to print librdkafka's reconnect line twenty times a second
and end on a ``KafkaError{...}`` repr. The probe's own client logs into a private logger that only
keeps what librdkafka said, so the person gets one line: what was tried, for how long, what
librdkafka saw, and what to check. Long-running commands (processor, consumer) do not probe: they
keep retrying, as docs/operations.md says.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

#: ``EX_UNAVAILABLE`` (sysexits.h): the cluster could not be reached; every short command exits so.
EXIT_UNREACHABLE = 69
PROBE_TIMEOUT_S = 10.0


class BrokerUnreachable(RuntimeError):
    """No broker of ``bootstrap.servers`` answered a metadata request within the probe's time."""


class _Keep(logging.Handler):
    """Keeps the distinct texts librdkafka logged (numbers aside), in order, to quote the first."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        text = str(args[2]) if isinstance(args, tuple) and len(args) == 3 else record.getMessage()
        # "[thrd:HOST:PORT/bootstrap]: HOST:PORT/bootstrap: Connect to ... failed": the last part says it
        text = re.sub(r"^\[thrd:[^\]]*\]:\s*", "", text)
        text = re.sub(r"^\S+/(?:bootstrap|\d+): ", "", text)
        if text not in self.texts:
            self.texts.append(text)


def probe(conf: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Return once the cluster answers a metadata request; raise :class:`BrokerUnreachable` if it does
    not within ``timeout_s``. Nothing is printed either way."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    logger = logging.getLogger("tokenfabric.kafka.probe")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    kept = _Keep()
    logger.addHandler(kept)
    bootstrap = conf.get("bootstrap.servers", "?")
    started = time.monotonic()
    settings: dict[str, Any] = {**conf, "logger": logger}
    admin = AdminClient(settings)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        waited = time.monotonic() - started
        admin.poll(0)  # hands librdkafka's queued log lines to the logger: they say what failed
        seen = kept.texts[0] if kept.texts else str(exc.args[0].str() if exc.args else exc)
        raise BrokerUnreachable(
            f"no Kafka broker answered at {bootstrap} within {waited:.0f} s ({seen}); check --bootstrap "
            "or KAFKA_BOOTSTRAP, that the broker runs and is reachable from here, and the security "
            "settings of --kafka-config or TOKENFABRIC_KAFKA_*"
        ) from None
    finally:
        logger.removeHandler(kept)
