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
from collections.abc import Callable, Iterator, Mapping
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


REGISTRY_PREFIX = "schema.registry."
"""Settings of the Schema Registry client (confluent-kafka's keys), kept out of librdkafka's."""


class ConfigError(ValueError):
    pass


def read_properties(path: str | Path) -> dict[str, str]:
    """A Java properties file, as Kafka's own tools and clients read it (``java.util.Properties``).

    A key ends at the first unescaped ``=``, ``:`` or blank, so ``key=value``, ``key = value``,
    ``key: value`` and ``key value`` all read alike, and ``bootstrap.servers=host:9092`` keeps its
    colon. ``#`` and ``!`` start comment lines; a line ending in an odd number of ``\\`` continues on
    the next (its leading blanks dropped); ``\\t``, ``\\n``, ``\\uXXXX`` and ``\\`` before any other
    character are escapes (a Windows path is written with ``/`` or ``\\\\``). Unlike Java, a key with
    neither separator nor value is an error: a bare word is more likely a pasted password than a
    property, and trailing blanks (not escaped ones) are dropped from values.
    """
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"kafka config {path}: {exc.strerror or exc}") from None
    for n, line in _logical_lines(text):
        parsed = _property(line)
        if parsed is None:
            raise ConfigError(
                f"kafka config {path}:{n}: expected key=value, key: value or key value "
                "(the line is not shown: it may hold a secret)"
            )
        out[parsed[0]] = parsed[1]
    return out


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first line, text) of each property, comments and blank lines skipped,
    continuation lines joined. A comment line never continues; a continued line is never a comment."""
    pending: str | None = None
    first = 0
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
            pending, first = "", n
        backslashes = len(line) - len(line.rstrip("\\"))
        if backslashes % 2:
            pending += line[:-1]
            continue
        yield first, pending + line
        pending = None
    if pending is not None:
        yield first, pending


def _property(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of one logical line, or None when it has no separator and no value."""
    key, i = _unescape_until(line, 0, "=: \t\f")
    while i < len(line) and line[i] in " \t\f":
        i += 1
    separated = i < len(line) and line[i] in "=:"
    if separated:
        i += 1
        while i < len(line) and line[i] in " \t\f":
            i += 1
    value, _ = _unescape_until(line, i, "")
    if not key or not (separated or value):
        return None
    return key, value


def _unescape_until(line: str, i: int, stops: str) -> tuple[str, int]:
    """The text from ``i`` to the first unescaped character of ``stops`` (or the end), unescaped,
    trailing unescaped blanks dropped; and the index it stopped at."""
    out: list[str] = []
    kept = 0  # length of ``out`` that rstrip must not cut into (ends with an escaped character)
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            nxt = line[i + 1]
            if nxt == "u" and len(line) >= i + 6:
                try:
                    out.append(chr(int(line[i + 2 : i + 6], 16)))
                    i += 6
                except ValueError:
                    out.append("u")
                    i += 2
            else:
                out.append(_ESCAPES.get(nxt, nxt))
                i += 2
            kept = len(out)
            continue
        if c in stops:
            break
        out.append(c)
        i += 1
    while len(out) > kept and out[-1] in " \t\f":
        out.pop()
    return "".join(out), i


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
    conf = {k: v for k, v in _file_and_env(config_file, env).items() if not k.startswith(REGISTRY_PREFIX)}
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    elif "bootstrap.servers" not in conf:
        found = env.get("KAFKA_BOOTSTRAP") or (fallback() if fallback is not None else None)
        if not found:
            raise ConfigError("no Kafka to talk to: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
        conf["bootstrap.servers"] = found
    return conf


def _file_and_env(config_file: str | None, env: Mapping[str, str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        conf.update(read_properties(path))
    conf.update(from_env(env))
    return conf


def registry_config(config_file: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``schema.registry.`` settings of the same file and environment as :func:`client_config`'s,
    without the prefix (``url``, ``basic.auth.user.info``, ...: as confluent-kafka's
    ``SchemaRegistryClient`` takes them); empty when none is set."""
    conf = _file_and_env(config_file, os.environ if env is None else env)
    return {k[len(REGISTRY_PREFIX) :]: v for k, v in conf.items() if k.startswith(REGISTRY_PREFIX)}


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
