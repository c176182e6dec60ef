"""Kafka client settings for every process, from a file and the environment, never from code.

Precedence, lowest first: built-in defaults, a properties file (``--kafka-config FILE``, or
``TOKENFABRIC_KAFKA_CONFIG``), environment variables ``TOKENFABRIC_KAFKA_<PROPERTY>`` (the librdkafka
property upper-cased with dots as underscores: ``TOKENFABRIC_KAFKA_SASL_PASSWORD`` sets
``sasl.password``), then an explicit ``--bootstrap``. ``bootstrap.servers`` falls back to
``KAFKA_BOOTSTRAP`` and then to the local broker that ``tokenfabric kafka start`` left running.

Secrets are passed to librdkafka only; ``redacted`` is what logs and ``status`` may print.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_PREFIX = "TOKENFABRIC_KAFKA_"
SECRET_MARKERS = ("password", "secret", "key", "token", "credential")


class ConfigError(ValueError):
    pass


def read_properties(path: str | Path) -> dict[str, str]:
    """``key=value`` lines; ``#`` and ``!`` start comments (Java properties, without escapes)."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"kafka config {path}: {exc.strerror or exc}") from None
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"kafka config {path}:{n}: expected key=value, got {line!r}")
        out[key.strip()] = value.strip()
    return out


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX) and name != ENV_PREFIX + "CONFIG":
            out[name[len(ENV_PREFIX) :].lower().replace("_", ".")] = value
    return out


def client_config(
    bootstrap: str | None = None, config_file: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The librdkafka settings every tokenfabric client starts from."""
    env = os.environ if env is None else env
    conf: dict[str, str] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        conf.update(read_properties(path))
    conf.update(from_env(env))
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    elif "bootstrap.servers" not in conf:
        conf["bootstrap.servers"] = env.get("KAFKA_BOOTSTRAP") or _local_bootstrap()
    return conf


def _local_bootstrap() -> str:
    from .kafka_local import broker_status, default_state_dir

    info = broker_status(default_state_dir())
    if info is None:
        raise ConfigError(
            "no Kafka to talk to: pass --bootstrap HOST:PORT, set KAFKA_BOOTSTRAP, "
            "or start a local broker with 'tokenfabric kafka start'"
        )
    return info.bootstrap


def is_secret(key: str) -> bool:
    k = key.lower()
    return any(marker in k for marker in SECRET_MARKERS) and not k.endswith(".location")


def redacted(conf: Mapping[str, object]) -> dict[str, object]:
    """A copy safe to print: secret values replaced by ``***``."""
    return {k: ("***" if is_secret(k) else v) for k, v in conf.items()}
