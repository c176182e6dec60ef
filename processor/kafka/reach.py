"""Can the cluster be reached? One quiet probe before a short command starts its real clients.

Why: a command run against a broker that is not there (a typo in ``--bootstrap``, a cluster behind a
firewall, wrong TLS or SASL settings) used to print librdkafka's reconnect line twenty times a second
and end on a ``KafkaError{...}`` repr. The probe's own client logs into a private logger that only
keeps what librdkafka said, so the person gets one line: what was tried, for how long, what
librdkafka saw, and what to check. Long-running commands (processor, consumer) wait instead
(:func:`wait_for_cluster`): they say the same line once, as a warning, and probe again every
``RETRY_S`` until the cluster answers or they are stopped, as docs/operations.md says. A broker that
answers but refuses the client (a wrong CA, an expired or untrusted client certificate, a wrong SASL
password) is :class:`ClusterRefused`: one line naming what to fix, exit 77, and no waiting, since
waiting does not cure it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from processor.kafka.exits import EXIT_CONFIG, EXIT_REFUSED, EXIT_UNREACHABLE, BrokerUnreachable
from processor.kafka.settings_check import WrongClientSettings, misconfigured_line, settings_refused

__all__ = [
    "EXIT_UNREACHABLE",
    "BrokerUnreachable",
    "ClusterRefused",
    "WrongClientSettings",
    "probe",
    "wait_for_cluster",
]

PROBE_TIMEOUT_S = 10.0
#: A waiting long-running command probes again this long after a probe failed.
RETRY_S = 5.0


class ClusterRefused(BrokerUnreachable):
    """A broker answered but refused this client before any request: the TLS handshake failed (the
    broker's certificate is not signed by ``ssl.ca.location``'s CA, or the broker refused the client's
    certificate) or the SASL login was refused. No retry helps; the message says what to fix."""

    exit_code = EXIT_REFUSED


#: librdkafka's texts for a refused TLS handshake or login -> what the operator should check. The
#: first that matches what librdkafka said names the cause (librdkafka 2.x wording).
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"certificate verify failed|broker certificate could not be verified"),
        "TLS handshake refused: the broker's certificate is not signed by the CA this client trusts "
        "(ssl.ca.location={ca}); use the CA that signed the cluster's certificates",
    ),
    (
        re.compile(r"alert certificate (?:expired|unknown|revoked)|alert bad certificate|alert unknown ca"),
        "TLS handshake refused by the broker: it does not accept this client's certificate ({cert}): "
        "expired, not yet valid, not signed by a CA the broker trusts, or missing; check its dates "
        "('keytool -list -v' or 'openssl x509 -noout -dates') and renew it",
    ),
    (
        re.compile(r"SASL authentication error|Authentication failed|SASL_AUTHENTICATION_FAILED"),
        "SASL login refused for user '{user}' ({mechanism}): wrong password or unknown user; check "
        "sasl.username and sasl.password (TOKENFABRIC_KAFKA_SASL_PASSWORD)",
    ),
)


def refused_line(texts: list[str], conf: Mapping[str, str]) -> str | None:
    """The operator's line for a refused handshake or login among librdkafka's ``texts``, else None."""
    values = {
        "ca": conf.get("ssl.ca.location", "the system's CAs"),
        "cert": conf.get("ssl.keystore.location") or conf.get("ssl.certificate.location") or "none set",
        "user": conf.get("sasl.username", "?"),
        "mechanism": conf.get("sasl.mechanism", "GSSAPI"),
    }
    for pattern, line in _REFUSALS:
        if any(pattern.search(t) for t in texts):
            return line.format(**values)
    return None


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
    try:  # librdkafka checks every setting, and loads the TLS files, as it builds the client
        admin = AdminClient(settings)
    except KafkaException as exc:
        raise settings_refused(exc, conf) from None
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        waited = time.monotonic() - started
        admin.poll(0)  # hands librdkafka's queued log lines to the logger: they say what failed
        seen = kept.texts[0] if kept.texts else str(exc.args[0].str() if exc.args else exc)
        wrong = misconfigured_line(kept.texts, conf)
        if wrong is not None:
            raise WrongClientSettings(f"{bootstrap}: {wrong}; exiting with {EXIT_CONFIG}") from None
        refused = refused_line(kept.texts, conf)
        if refused is not None:
            raise ClusterRefused(f"{bootstrap}: {refused}; exiting with {EXIT_REFUSED}") from None
        raise BrokerUnreachable(
            f"no Kafka broker answered at {bootstrap} within {waited:.0f} s ({seen}); check --bootstrap "
            "or KAFKA_BOOTSTRAP, that the broker runs and is reachable from here, and the security "
            "settings of --kafka-config or TOKENFABRIC_KAFKA_*"
        ) from None
    finally:
        logger.removeHandler(kept)


def wait_for_cluster(
    conf: Mapping[str, str],
    stop: threading.Event,
    log: logging.Logger,
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    retry_s: float = RETRY_S,
) -> bool:
    """Block until the cluster answers: True then, False if ``stop`` was set first.

    A refused handshake or login (:class:`ClusterRefused`) is raised at once: waiting does not cure it.
    The first failed probe is logged once, as a WARNING, with :func:`probe`'s line and the retry
    interval; later failures are silent (the condition has not changed), and a cluster that answers
    after a failure gets one INFO line. A stop request is seen within one probe's ``timeout_s``.
    """
    bootstrap = conf.get("bootstrap.servers", "?")
    started = time.monotonic()
    failed = False
    while not stop.is_set():
        try:
            probe(conf, timeout_s)
        except (ClusterRefused, WrongClientSettings):  # waiting cures neither
            raise
        except BrokerUnreachable as exc:
            if not failed:
                log.warning("%s; retrying every %g s until it answers", exc, retry_s)
                failed = True
            stop.wait(retry_s)
            continue
        if failed:
            log.info("Kafka at %s answered after %.0f s", bootstrap, time.monotonic() - started)
        return True
    return False
