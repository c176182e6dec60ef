"""A secured local broker: TLS, mutual TLS, SASL/SCRAM-SHA-512 and an authorizer that denies by default.

Why: a platform team's Kafka is secured, and the first thing its operators do is run the product
under a principal that holds only the ACLs docs/operations.md lists (``tokenfabric acls``). This
broker lets the tests and a developer do the same on one machine. ``start_broker(..., secure=...)``
(processor.local.broker) starts it; the default start is untouched.

Three client listeners, one per way a client proves who it is, all with the same principals:

* ``SASL_SSL`` (:data:`TLS`): TLS with the broker's certificate checked against the throwaway CA,
  and a SCRAM-SHA-512 login. The broker's ``bootstrap``.
* ``SSL`` (:data:`MTLS`): mutual TLS; the client's certificate ``CN=<name>`` is the principal
  ``User:<name>`` (processor.local.tls.PRINCIPAL_RULE). Also the inter-broker listener: the broker
  talks to itself (transaction markers, the controller) as ``User:tokenfabric-broker``.
* ``SASL_PLAINTEXT`` (:data:`SCRAM`): SCRAM-SHA-512 without TLS, for tests of the login alone.

The controller listener is mutual TLS too, so no port of this broker accepts an anonymous client.
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a principal may do only what
an ACL allows, except the super users, the broker's own and ``tokenfabric-admin`` (the setup user:
topics, ACLs). SCRAM users are written by ``kafka-storage format --add-scram`` before the first start.

Files, under ``<state dir>/security`` (owner only: they hold passwords and keys): the CA
(``tokenfabric-local-ca.pem``), one PKCS#12 store per identity, and for every user one librdkafka
properties file per listener (``<user>.<listener>.properties``), usable as ``--kafka-config``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from processor.local.jars import KafkaLocalError, write_atomic
from processor.local.tls import PRINCIPAL_RULE, Authority, Identity, check_name, issue, make_authority

TLS = "SASL_SSL"
MTLS = "SSL"
SCRAM = "SASL_PLAINTEXT"
LISTENERS = (TLS, MTLS, SCRAM)
"""The client listeners, in the order of their ports; the first is the broker's ``bootstrap``."""

BROKER_USER = "tokenfabric-broker"
ADMIN_USER = "tokenfabric-admin"
SUPER_USERS = (BROKER_USER, ADMIN_USER)

MECHANISM = "SCRAM-SHA-512"

_SETUP_FILE = "security.json"


@dataclass(frozen=True)
class SecureSetup:
    """The CA, certificates and SCRAM users of one secured broker start, and what clients need of them.

    ``users`` maps every SCRAM user (the admin included) to its password; ``identities`` holds a client
    certificate for each user, plus the broker's own.
    """

    directory: Path
    authority: Authority
    broker: Identity
    users: dict[str, str] = field(repr=False)
    identities: dict[str, Identity] = field(repr=False)

    @classmethod
    def create(
        cls,
        directory: Path,
        users: Mapping[str, str | None] | Iterable[str] = (),
        *,
        expired: Iterable[str] = (),
        validity_days: int = 30,
    ) -> SecureSetup:
        """A fresh CA in ``directory`` (emptied), a server certificate for the broker, and for each of
        ``users`` (and the admin) a SCRAM password (random where none is given) and a client
        certificate. ``expired`` users get a certificate that expired yesterday (to test that refusal).
        """
        given = dict(users) if isinstance(users, Mapping) else dict.fromkeys(users)
        expired = set(expired)
        for name, password in given.items():
            check_name(name, "user")
            if name in SUPER_USERS:
                raise KafkaLocalError(f"user {name!r}: the broker's own, choose another name")
            if password is not None and (not password or any(c in password for c in "[],=\"'\\ \n")):
                raise KafkaLocalError(f"password of {name!r}: non-empty, without [ ] , = quotes \\ or blanks")
        if directory.exists():
            for old in directory.iterdir():
                old.unlink()
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        authority = make_authority(directory, validity_days=validity_days)
        broker = issue(authority, BROKER_USER, validity_days=validity_days, server_ip="127.0.0.1")
        passwords = {ADMIN_USER: secrets.token_hex(16)}
        passwords.update({n: p or secrets.token_hex(16) for n, p in given.items()})
        identities = {
            name: (
                issue(authority, name, start="-2d", validity_days=1)
                if name in expired
                else issue(authority, name, validity_days=validity_days)
            )
            for name in passwords
        }
        return cls(directory, authority, broker, passwords, identities)

    def broker_properties(self, ports: Mapping[str, int], controller_port: int, host: str) -> dict[str, str]:
        """The broker's listener, TLS, SASL and authorizer settings (added to processor.local.broker's)."""
        store = {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.broker.store),
            "ssl.keystore.password": self.broker.password,
            "ssl.key.password": self.broker.password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.authority.cert_pem),
        }
        listeners = [f"{name}://{host}:{ports[name]}" for name in LISTENERS]
        scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "listeners": ",".join([*listeners, f"CONTROLLER://{host}:{controller_port}"]),
            "advertised.listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join(
                [f"{name}:{name}" for name in LISTENERS] + ["CONTROLLER:SSL"]
            ),
            "inter.broker.listener.name": MTLS,
            **store,
            "ssl.client.auth": "required",  # mutual TLS on SSL and CONTROLLER
            f"listener.name.{TLS.lower()}.ssl.client.auth": "none",  # SASL_SSL: the login says who
            "ssl.principal.mapping.rules": PRINCIPAL_RULE,
            "sasl.enabled.mechanisms": MECHANISM,
            **{
                f"listener.name.{name.lower()}.{MECHANISM.lower()}.sasl.jaas.config": scram_login
                for name in (TLS, SCRAM)
            },
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(f"User:{name}" for name in SUPER_USERS),
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM users before the first start."""
        out: list[str] = []
        for name, password in self.users.items():
            out += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
        return out

    def client_conf(self, user: str, listener: str, bootstrap: str) -> dict[str, str]:
        """librdkafka settings that connect as ``user`` through ``listener`` (one of :data:`LISTENERS`)."""
        if user not in self.users:
            raise KafkaLocalError(f"no user {user!r} on this broker (users: {', '.join(sorted(self.users))})")
        conf = {"bootstrap.servers": bootstrap, "security.protocol": listener}
        if listener in (TLS, MTLS):
            conf["ssl.ca.location"] = str(self.authority.cert_pem)
        if listener == MTLS:
            identity = self.identities[user]
            conf["ssl.keystore.location"] = str(identity.store)
            conf["ssl.keystore.password"] = identity.password
        else:
            conf.update(
                {"sasl.mechanism": MECHANISM, "sasl.username": user, "sasl.password": self.users[user]}
            )
        return conf

    def java_client_conf(self, user: str, listener: str) -> dict[str, str]:
        """The same login for a Java client (Kafka's own tools' ``--command-config``)."""
        conf = {"security.protocol": listener}
        if listener in (TLS, MTLS):
            conf.update(
                {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.authority.cert_pem)}
            )
        if listener == MTLS:
            identity = self.identities[user]
            conf.update(
                {
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": str(identity.store),
                    "ssl.keystore.password": identity.password,
                }
            )
        else:
            conf.update(
                {
                    "sasl.mechanism": MECHANISM,
                    "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{user}" password="{self.users[user]}";',
                }
            )
        return conf

    def write_client_files(self, bootstraps: Mapping[str, str]) -> dict[str, dict[str, Path]]:
        """Per user and listener (owner only), librdkafka's settings as ``<user>.<listener>.properties``
        (tokenfabric's ``--kafka-config``) and a Java client's as ``<user>.<listener>.java.properties``
        (Kafka's tools' ``--command-config``); returns user -> listener -> the first. Also
        ``security.json``, which :func:`client_files` reads back."""
        out: dict[str, dict[str, Path]] = {}
        for user in self.users:
            for listener in LISTENERS:
                path = self.directory / f"{user}.{listener.lower()}.properties"
                files = {
                    path: self.client_conf(user, listener, bootstraps[listener]),
                    path.with_suffix(".java.properties"): self.java_client_conf(user, listener),
                }
                for file, conf in files.items():
                    write_atomic(file, "".join(f"{k}={_escape(v)}\n" for k, v in conf.items()))
                    file.chmod(0o600)
                out.setdefault(user, {})[listener] = path
        record = {
            "ca": str(self.authority.cert_pem),
            "bootstraps": dict(bootstraps),
            "users": sorted(self.users),
            "client_files": {u: {k: str(v) for k, v in files.items()} for u, files in out.items()},
        }
        write_atomic(self.directory / _SETUP_FILE, json.dumps(record, indent=2) + "\n")
        return out


def _escape(value: str) -> str:
    """A properties-file value: ``\\`` and a leading blank escaped (paths and hex passwords only)."""
    return value.replace("\\", "\\\\")


def client_files(directory: Path) -> dict[str, dict[str, str]]:
    """user -> listener -> properties file of a secured broker's ``security`` folder ({} if none)."""
    try:
        record = json.loads((directory / _SETUP_FILE).read_text())
    except (OSError, ValueError):
        return {}
    files = record.get("client_files", {})
    return files if isinstance(files, dict) else {}
