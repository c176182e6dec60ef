"""Client settings a cluster cannot be used with: one line naming the setting, exit 78.

Why: librdkafka checks every property, and loads the TLS files, as it builds a client, and raises
``_INVALID_ARG`` with its own text (``No such configuration property: "x"``, ``ssl.ca.location
failed: ...BIO lib``, ``PKCS#12 ... mac verify failure``); a command that let it through printed an
18-line traceback. A broker that does not offer ``sasl.mechanism`` answered as if unreachable (69).
Both are settings a restart does not cure and no wait repairs: :class:`WrongClientSettings` is
raised at once (processor.kafka.reach never waits on it, unlike an unreachable broker), with exit
:data:`~processor.kafka.exits.EXIT_CONFIG` (``EX_CONFIG``, 78).

Invariant: the line names the setting (and its value when it is a file), never a password.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from processor.kafka.exits import EXIT_CONFIG, BrokerUnreachable


class WrongClientSettings(BrokerUnreachable):
    """The client's own settings are wrong: an unknown or malformed property, a TLS file missing or
    unreadable, a key store its password does not open, a SASL mechanism the broker does not offer."""

    exit_code = EXIT_CONFIG


_UNKNOWN = re.compile(r'No such configuration property: "([^"]+)"')
_FILE_SETTING = re.compile(r"(ssl\.[a-z.]+\.location)")
_MECHANISMS = re.compile(r"Unsupported SASL mechanism: broker's supported mechanisms: ([A-Z0-9_,-]+)")


def settings_line(text: str, conf: Mapping[str, Any]) -> str:
    """What is wrong with the settings, from librdkafka's text for a client it would not build."""
    unknown = _UNKNOWN.search(text)
    if unknown:
        return (
            f"unknown client setting {unknown.group(1)!r} (no such librdkafka property); remove it or "
            f"fix its name (--kafka-config or TOKENFABRIC_KAFKA_*)"
        )
    found = _FILE_SETTING.search(text)
    if found:
        setting = found.group(1)
        path = str(conf.get(setting, "?"))
        if not os.path.isfile(path):
            return f"{setting}={path}: no such file; point it at the file"
        if "mac verify failure" in text or "PKCS12" in text or "PKCS#12" in text:
            return (
                f"ssl.keystore.password does not open {setting}={path} (or it is not a PKCS#12 key "
                f"store); check the password (TOKENFABRIC_KAFKA_SSL_KEYSTORE_PASSWORD) and the file"
            )
        return f"{setting}={path}: not a PEM certificate librdkafka can read; give the CA's PEM file"
    said = text.replace("Failed to create admin client: ", "")
    return f"invalid client settings: {said} (--kafka-config or TOKENFABRIC_KAFKA_*)"


def settings_refused(exc: BaseException, conf: Mapping[str, Any]) -> WrongClientSettings:
    """The :class:`WrongClientSettings` for a client librdkafka refused to build (``exc``)."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    text = error.str() if isinstance(error, KafkaError) else str(exc)
    return WrongClientSettings(f"{settings_line(text, conf)}; exiting with {EXIT_CONFIG}")


def misconfigured_line(texts: list[str], conf: Mapping[str, Any]) -> str | None:
    """The line for a SASL mechanism the broker does not offer, among librdkafka's ``texts``."""
    for text in texts:
        offered = _MECHANISMS.search(text)
        if offered:
            mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI"))
            return (
                f"sasl.mechanism={mechanism}: the broker does not offer it (it offers "
                f"{offered.group(1)}); set sasl.mechanism to one of those"
            )
    return None
