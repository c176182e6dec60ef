"""Kafka client settings for every process, from a file and the environment, never from code.

Precedence, lowest first: built-in defaults, a properties file (``--kafka-config FILE``, or
``TOKENFABRIC_KAFKA_CONFIG``), environment variables ``TOKENFABRIC_KAFKA_<PROPERTY>`` (the librdkafka
property upper-cased with dots as underscores: ``TOKENFABRIC_KAFKA_SASL_PASSWORD`` sets
``sasl.password``), then an explicit ``--bootstrap``. ``bootstrap.servers`` falls back to
``KAFKA_BOOTSTRAP``, then to what the caller's ``fallback`` names (the CLI passes the local broker that
``tokenfabric kafka start`` left running: this module knows nothing of it).

Why the environment: in Kubernetes a Secret reaches a container as an environment variable
(``secretKeyRef``) without ever being written into a ConfigMap or a command line, where ``ps`` and
``kubectl describe`` would show it. librdkafka has no property with an underscore in its name, so
"underscore means dot" is unambiguous. Two names under the prefix are not properties:
``TOKENFABRIC_KAFKA_CONFIG`` (the file) and ``TOKENFABRIC_KAFKA_JVM_OPTS`` (the local broker's JVM).

Secrets are passed to librdkafka only; ``redacted`` is what logs and ``status`` may print, and no
error raised here quotes a line of the file (a malformed line may be a pasted password).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

ENV_PREFIX = "TOKENFABRIC_KAFKA_"
#: Names under ``ENV_PREFIX`` that are not librdkafka properties.
RESERVED_ENV = frozenset({ENV_PREFIX + "CONFIG", ENV_PREFIX + "JVM_OPTS"})
SECRET_MARKERS = (
    "password",
    "secret",
    "key",
    "token",
    "credential",
    "passphrase",
    "jaas",
    "oauthbearer.config",
)


class ConfigError(ValueError):
    pass


def read_properties(path: str | Path) -> dict[str, str]:
    """``key=value`` (or ``key: value``) lines; ``#`` and ``!`` start comments.

    Java properties without escapes or continuation lines: what a Kafka client config file holds.
    The first ``=`` or ``:`` ends the key, so ``bootstrap.servers=host:9092`` reads as expected.
    """
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"kafka config {path}: {exc.strerror or exc}") from None
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        key = line[:cut].strip() if cut > 0 else ""
        if not key or any(c.isspace() for c in key):
            raise ConfigError(
                f"kafka config {path}:{n}: expected key=value (the line is not shown: it may hold a secret)"
            )
        out[key] = line[cut + 1 :].strip()
    return out


def from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties named by ``TOKENFABRIC_KAFKA_<PROPERTY>`` variables."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if name.startswith(ENV_PREFIX) and name not in RESERVED_ENV and len(name) > len(ENV_PREFIX):
            out[env_property(name)] = value
    return out


def env_property(name: str) -> str:
    """``TOKENFABRIC_KAFKA_SASL_PASSWORD`` -> ``sasl.password``."""
    return name[len(ENV_PREFIX) :].lower().replace("_", ".")


def client_config(
    bootstrap: str | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    fallback: Callable[[], str] | None = None,
) -> dict[str, str]:
    """The librdkafka settings every tokenfabric client starts from.

    ``fallback`` is asked for ``bootstrap.servers`` when neither the flag, the file, the environment
    nor ``KAFKA_BOOTSTRAP`` names one; without it that is a :class:`ConfigError`.
    """
    env = os.environ if env is None else env
    conf: dict[str, str] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        conf.update(read_properties(path))
    conf.update(from_env(env))
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    elif "bootstrap.servers" not in conf:
        found = env.get("KAFKA_BOOTSTRAP") or (fallback() if fallback is not None else None)
        if not found:
            raise ConfigError("no Kafka to talk to: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
        conf["bootstrap.servers"] = found
    return conf


def is_secret(key: str) -> bool:
    """True for properties whose value must never be printed (paths to key files are not secrets)."""
    k = key.lower()
    return any(marker in k for marker in SECRET_MARKERS) and not k.endswith(".location")


def redacted(conf: Mapping[str, object]) -> dict[str, object]:
    """A copy safe to print: secret values replaced by ``***``."""
    return {k: ("***" if is_secret(k) else v) for k, v in conf.items()}


def describe(conf: Mapping[str, object]) -> str:
    """One log line of the settings in force, secrets redacted, callables (loggers) left out."""
    safe = redacted({k: v for k, v in conf.items() if not callable(v) and not hasattr(v, "handlers")})
    return ", ".join(f"{k}={v}" for k, v in sorted(safe.items()))
