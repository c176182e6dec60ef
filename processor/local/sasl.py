"""SASL/PLAIN users for a local broker started with logins (the SASL tests and docs/kafka-local.md)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from processor.local.jars import KafkaLocalError

_SASL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

_BROKER_USER = "tokenfabric-broker"


@dataclass(frozen=True)
class SaslSetup:
    """The PLAIN users of a SASL broker, plus the broker's own login for inter-broker requests."""

    users: dict[str, str] = field(repr=False)
    broker_user: str
    broker_password: str = field(repr=False)

    @classmethod
    def create(cls, users: Mapping[str, str]) -> SaslSetup:
        for name, password in users.items():
            # The JAAS line quotes values with '"' and has no escapes; a property file reads '\\'.
            if not _SASL_NAME.match(name) or name == _BROKER_USER:
                raise KafkaLocalError(
                    f"SASL user name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -, not {_BROKER_USER!r}"
                )
            if not password or any(c in password for c in '"\\;\n\r'):
                raise KafkaLocalError(f"SASL password of {name!r}: non-empty, without quotes, \\ or ;")
        return cls(dict(users), _BROKER_USER, secrets.token_hex(16))

    def jaas(self) -> str:
        accounts = {self.broker_user: self.broker_password, **self.users}
        users = " ".join(f'user_{name}="{password}"' for name, password in accounts.items())
        return (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{self.broker_user}" password="{self.broker_password}" {users};'
        )

    def client_conf(self) -> dict[str, str]:
        """librdkafka settings that log in as the broker's own user (its readiness check)."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": self.broker_user,
            "sasl.password": self.broker_password,
        }
